"""camplib.parallel.mesh: coordinates and groups equal to torch's `init_device_mesh` (row-major,
TP innermost), sub-groups that really reduce over their dimension only, and bad sizes refused
with the numbers named before any rank starts."""
import pytest
import torch
import torch.distributed as dist

from camplib.dist import on_ranks
from camplib.parallel.mesh import DIMS, MeshShape, ProcessMesh, check_layout


def test_coordinates_are_row_major_with_tp_innermost():
    shape = MeshShape(dp=2, pp=2, tp=2)
    grid = torch.arange(8).view(shape.sizes)        # what init_device_mesh lays out
    for rank in range(8):
        c = shape.coords(rank)
        assert grid[tuple(c[d] for d in shape.order)].item() == rank, (rank, c)
        assert shape.rank_of(**c) == rank
    assert shape.group_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]   # neighbours
    assert shape.group_ranks("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert shape.group_ranks("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert shape.group_ranks("cp") == [[r] for r in range(8)]


def test_every_rank_is_in_exactly_one_group_per_dimension():
    shape = MeshShape(dp=3, pp=2, cp=2, tp=2, order=("dp", "pp", "cp", "tp"))
    for dim in DIMS:
        groups = shape.group_ranks(dim)
        assert sorted(r for g in groups for r in g) == list(range(shape.world_size))
        assert all(len(g) == getattr(shape, dim) for g in groups)
        for g in groups:   # members differ only along dim, and sit in coordinate order
            assert [shape.coords(r)[dim] for r in g] == list(range(len(g)))
            assert len({tuple(v for d, v in shape.coords(r).items() if d != dim) for r in g}) == 1


@pytest.mark.parametrize("bad, words", [
    (dict(dp=0), "dp=0"), (dict(tp=2.0), "tp=2.0"), (dict(order=("dp", "tp", "pp")), "exactly once")])
def test_bad_sizes_are_refused(bad, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        MeshShape(**bad)


def test_world_size_mismatch_names_the_numbers():
    with pytest.raises(ValueError, match=r"needs 12 ranks, but there are 8"):
        MeshShape(dp=3, tp=2, pp=2).check_world(8)
    with pytest.raises(ValueError, match=r"rank 8 is outside"):
        MeshShape(dp=2, tp=2, pp=2).coords(8)


def test_check_layout_lists_every_problem():
    with pytest.raises(ValueError) as err:
        check_layout(MeshShape(tp=4, pp=8, cp=1, dp=1), 32, n_layer=4, n_head=6, seq_len=7, vocab_size=10)
    msg = str(err.value)
    for words in ("n_head=6 is not divisible by tp=4", "vocab_size=10 is not divisible by tp=4",
                  "pp=8 stages but only n_layer=4", "seq_len=7 is not divisible by 2*cp=2"):
        assert words in msg, msg
    check_layout(MeshShape(dp=2, tp=2, pp=2), 8, n_layer=2, n_head=4, seq_len=8)   # fits: no error


def _mesh_rank(rank, world_size, shape):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = ProcessMesh(shape)
    torch_mesh = init_device_mesh("cpu", shape.sizes, mesh_dim_names=shape.order)
    out = {}
    for dim in shape.order:
        x = torch.tensor([float(rank)])
        dist.all_reduce(x, group=mesh.group(dim))
        out[f"sum_{dim}"] = x.item()
        out[f"members_{dim}"] = mesh.members(dim)
        out[f"torch_{dim}"] = torch_mesh[dim].mesh.tolist()
        out[f"rank_in_{dim}"] = dist.get_rank(mesh.group(dim)) == mesh.coord(dim)
    return out


def test_process_mesh_groups_equal_init_device_mesh_on_8_ranks():
    shape = MeshShape(dp=2, pp=2, tp=2)
    out = on_ranks(_mesh_rank, 8, shape, timeout=30)
    for dim in shape.order:
        assert out[f"members_{dim}"] == out[f"torch_{dim}"], dim
        assert all(out[f"rank_in_{dim}"]), dim
        for rank in range(8):   # the all-reduce summed exactly the ranks of the group
            members = shape.group_ranks(dim)[[rank in g for g in shape.group_ranks(dim)].index(True)]
            assert out[f"sum_{dim}"][rank] == sum(members), (dim, rank)


def _wrong_world(rank, world_size):
    ProcessMesh(MeshShape(dp=3))
    return {}


def test_process_mesh_on_the_wrong_world_fails_on_every_rank_without_hanging():
    from camplib.dist import RankError
    with pytest.raises(RankError, match=r"needs 3 ranks, but there are 2"):
        on_ranks(_wrong_world, 2, timeout=10)


def test_dp_cp_and_embedding_groups_join_the_right_ranks():
    """"dp_cp": the ranks sharing pp and tp (the hybrid trainer's gradient average); "embedding":
    the first and last stage of each pipeline (a tied embedding's gradient sum)."""
    shape = MeshShape(dp=2, pp=3, cp=2, tp=2)
    groups = shape.group_ranks("dp_cp")
    assert sorted(r for g in groups for r in g) == list(range(24))
    for g in groups:
        coords = [shape.coords(r) for r in g]
        assert len({(c["pp"], c["tp"]) for c in coords}) == 1, g
        assert sorted((c["dp"], c["cp"]) for c in coords) == [(0, 0), (0, 1), (1, 0), (1, 1)], g
    for first, last in shape.embedding_ranks():
        a, b = shape.coords(first), shape.coords(last)
        assert (a.pop("pp"), b.pop("pp")) == (0, 2) and a == b, (first, last)
    assert len(shape.embedding_ranks()) == 8          # one per pipeline; the middle stage is in none
    assert MeshShape(dp=2).embedding_ranks() == [[0], [1]]
    with pytest.raises(ValueError, match="unknown mesh dimension 'dp_tp'"):
        shape.group_ranks("dp_tp")


def _embedding_rank(rank, world_size):
    mesh = ProcessMesh(MeshShape(pp=3))
    try:
        group = mesh.group("embedding")
    except ValueError as err:
        return {"sum": None, "error": str(err)}
    x = torch.tensor([float(rank)])
    dist.all_reduce(x, group=group)
    return {"sum": x.item(), "error": None}


def test_a_middle_stage_is_in_no_embedding_group_and_says_so():
    out = on_ranks(_embedding_rank, 3, timeout=30)
    assert out["sum"] == [2.0, None, 2.0], out
    assert "rank 1 (pp=1 of 3) is in no 'embedding' group" in out["error"][1], out["error"]
