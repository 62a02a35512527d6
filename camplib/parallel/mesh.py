"""A process-group mesh for 4D parallelism: every rank sits at one coordinate of a grid of
named dimensions, and talks to the ranks that differ from it in one dimension only.

    dp  data parallel      same model pieces, different batches (ZeRO shards over this group)
    pp  pipeline parallel  different layers
    cp  context parallel   different pieces of the sequence (ring attention)
    tp  tensor parallel    different pieces of every weight matrix

Ranks are laid out row-major over `order` (outermost first), exactly as torch's
`init_device_mesh` does (`arange(world).view(sizes)`). The default order puts TP innermost, as
torchtitan and Megatron do: TP talks most (4 all-reduces per block, forward and backward), so
its ranks are neighbours, which on real machines means the same node and NVLink. PP, which
sends one activation per micro-batch, is outermost and may cross nodes.

Two more kinds of group join ranks across dimensions: "dp_cp", the ranks that share pp and tp (the
data-parallel replicas and the context shards together: their gradients are averaged together,
as in Megatron's data-parallel-with-context group), and "embedding", the first and the last stage
of each pipeline (a tied token embedding / LM head lives on both: its gradient is summed there).

`MeshShape` is plain arithmetic (coordinates, which ranks form each group) and checks its sizes
before anything starts; `ProcessMesh` builds the torch.distributed sub-groups on a running rank.
`check_layout` says, before any rank starts work, whether a model can be cut this way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

__all__ = ["DIMS", "GROUPS", "MeshShape", "ProcessMesh", "check_layout"]

DIMS = ("pp", "dp", "cp", "tp")   # default order, outermost -> innermost (TP innermost)
GROUPS = DIMS + ("dp_cp", "embedding")   # every kind of group a ProcessMesh builds


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the four dimensions and their order. `MeshShape(dp=2, tp=2, pp=2)` is 8 ranks."""
    dp: int = 1
    pp: int = 1
    cp: int = 1
    tp: int = 1
    order: tuple[str, ...] = DIMS

    def __post_init__(self):
        for dim in DIMS:
            size = getattr(self, dim)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(f"mesh size {dim}={size!r}: every dimension needs a whole number >= 1")
        if sorted(self.order) != sorted(DIMS):
            raise ValueError(f"mesh order {tuple(self.order)} must name each of {DIMS} exactly once")
        object.__setattr__(self, "order", tuple(self.order))

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    @property
    def sizes(self) -> tuple[int, ...]:
        """Sizes in `order` (what `init_device_mesh(device, sizes, mesh_dim_names=order)` takes)."""
        return tuple(getattr(self, d) for d in self.order)

    def describe(self) -> str:
        return " x ".join(f"{d}={getattr(self, d)}" for d in self.order)

    def check_world(self, world_size: int) -> None:
        """A ValueError naming the sizes when they do not multiply to `world_size`."""
        if self.world_size != world_size:
            raise ValueError(f"mesh {self.describe()} needs {self.world_size} ranks, but there are {world_size}: "
                             "the sizes must multiply to the world size")

    def coords(self, rank: int) -> dict[str, int]:
        """{dim: index} of `rank` (row-major: the last dimension of `order` varies fastest)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the mesh {self.describe()} of {self.world_size} ranks")
        out = {}
        for dim in reversed(self.order):
            size = getattr(self, dim)
            out[dim] = rank % size
            rank //= size
        return {d: out[d] for d in self.order}

    def rank_of(self, **coords: int) -> int:
        """The rank at these coordinates (dimensions left out are 0)."""
        unknown = sorted(set(coords) - set(DIMS))
        if unknown:
            raise ValueError(f"unknown mesh dimensions {unknown}: the mesh has {DIMS}")
        rank = 0
        for dim in self.order:
            size, index = getattr(self, dim), coords.get(dim, 0)
            if not 0 <= index < size:
                raise ValueError(f"{dim}={index} is outside 0..{size - 1}")
            rank = rank * size + index
        return rank

    def group_ranks(self, dim: str) -> list[list[int]]:
        """Every group of dimension `dim`: the ranks that share all other coordinates, ordered by
        their index along `dim` (so a rank's position in its group is its coordinate). Groups are
        listed by their lowest rank: the order every rank creates them in. `dim` may also be
        "dp_cp" (ranks sharing pp and tp, in rank order) or "embedding" (`embedding_ranks`)."""
        if dim == "embedding":
            return self.embedding_ranks()
        if dim not in GROUPS:
            raise ValueError(f"unknown mesh dimension {dim!r}: the mesh has {DIMS} (and the groups {GROUPS[4:]})")
        spanned = dim.split("_")
        groups = {}
        for rank in range(self.world_size):
            c = self.coords(rank)
            key = tuple(c[d] for d in self.order if d not in spanned)
            groups.setdefault(key, []).append(rank)
        return sorted(groups.values())

    def embedding_ranks(self) -> list[list[int]]:
        """Megatron's embedding groups: [first stage, last stage] of each pipeline (the ranks that
        hold a tied token embedding and LM head), [rank] when pp == 1."""
        return [[g[0], g[-1]] if len(g) > 1 else g for g in self.group_ranks("pp")]


def check_layout(shape: MeshShape, world_size: int, *, n_layer: int, n_head: int, seq_len: int,
                 vocab_size: int | None = None, n_kv_head: int | None = None, batch: int | None = None,
                 zigzag: bool = True) -> None:
    """Every reason a model cannot be cut on this mesh, as one ValueError naming the numbers,
    raised before any rank starts work. The vocabulary is checked only when given (`vocab_size`):
    camplib's tensor-parallel model pads it to a multiple of tp instead."""
    shape.check_world(world_size)
    problems = []
    if n_head % shape.tp:
        problems.append(f"n_head={n_head} is not divisible by tp={shape.tp}")
    if n_kv_head is not None and n_kv_head % shape.tp:
        problems.append(f"n_kv_head={n_kv_head} is not divisible by tp={shape.tp}")
    if vocab_size is not None and vocab_size % shape.tp:
        problems.append(f"vocab_size={vocab_size} is not divisible by tp={shape.tp}")
    if shape.pp > n_layer:
        problems.append(f"pp={shape.pp} stages but only n_layer={n_layer} layers: a stage would hold none")
    pieces = 2 * shape.cp if zigzag else shape.cp
    if seq_len % pieces:
        problems.append(f"seq_len={seq_len} is not divisible by 2*cp={pieces} (the zig-zag split cuts the sequence "
                        "into 2cp chunks)" if zigzag else f"seq_len={seq_len} is not divisible by cp={pieces}")
    if batch is not None and batch % shape.dp:
        problems.append(f"batch={batch} is not divisible by dp={shape.dp}")
    if problems:
        raise ValueError(f"cannot lay the model out on mesh {shape.describe()}: " + "; ".join(problems))


class ProcessMesh:
    """This rank's place on a mesh, with one torch.distributed group per dimension (and the
    "dp_cp" and "embedding" groups: a group equal to one already built is that one, not a copy).

    Built on every rank of a running process group (the same call everywhere: torch requires
    every rank to create every group, in the same order). `group(dim)` is the group this rank
    belongs to along `dim`; `coord(dim)` its index there, which is also its rank inside that
    group. Collectives on the sub-groups inherit launch's timeout, so a mismatch fails, never hangs.
    """

    def __init__(self, shape: MeshShape):
        if not dist.is_initialized():
            raise RuntimeError("ProcessMesh needs a running process group: build it inside a rank "
                               "(camplib.dist.launch / on_ranks, or under torchrun)")
        shape.check_world(dist.get_world_size())
        self.shape, self.rank = shape, dist.get_rank()
        self.coords = shape.coords(self.rank)
        self._groups, self._members = {}, {}
        built: dict[tuple, object] = {}     # the same ranks: the same group (no new_group call)
        for dim in shape.order + GROUPS[4:]:
            layout = shape.group_ranks(dim)
            if tuple(map(tuple, layout)) not in built:
                built[tuple(map(tuple, layout))] = {tuple(ranks): dist.new_group(ranks) for ranks in layout}
            groups = built[tuple(map(tuple, layout))]
            for ranks in layout:
                if self.rank in ranks:
                    self._groups[dim], self._members[dim] = groups[tuple(ranks)], ranks

    def group(self, dim: str):
        self._check_member(dim)
        return self._groups[dim]

    def members(self, dim: str) -> list[int]:
        """Global ranks of this rank's group along `dim`, in coordinate order."""
        self._check_member(dim)
        return list(self._members[dim])

    def _check_member(self, dim: str) -> None:
        if dim not in GROUPS:
            raise ValueError(f"unknown mesh group {dim!r}: the mesh has {GROUPS}")
        if dim not in self._groups:   # only "embedding": a middle pipeline stage holds no embedding
            raise ValueError(f"rank {self.rank} (pp={self.coords['pp']} of {self.shape.pp}) is in no {dim!r} group: "
                             "only the first and the last pipeline stage are")

    def coord(self, dim: str) -> int:
        """This rank's index along `dim` (for "dp_cp" and "embedding": its place in that group)."""
        return self.coords[dim] if dim in DIMS else self.members(dim).index(self.rank)

    def size(self, dim: str) -> int:
        return getattr(self.shape, dim) if dim in DIMS else len(self.members(dim))

    def __repr__(self) -> str:
        return f"ProcessMesh(rank {self.rank} at {self.coords} of {self.shape.describe()})"
