"""Ring collectives built from sends and receives equal torch.distributed's own, and each rank
sends exactly the bandwidth-optimal 2(N-1)/N * S bytes (REFERENCE.md, ring all-reduce).
Tolerances: fp32 sums in a different order, atol 1e-5 on values of size ~N; fp64 exact to 1e-12."""
import pytest
import torch
import torch.distributed as dist

from camplib.dist import launch
from camplib.dist.counting import count_bytes
from camplib.dist.harness import run_collective
from camplib.dist.ring import RingCollectives, TorchCollectives, ring_all_reduce

pytestmark = pytest.mark.parity


def _inputs(n, numel, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g, dtype=dtype) for _ in range(n)]


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_all_reduce_is_the_sum_and_sends_2_n_minus_1_over_n_of_the_bytes(world_size):
    numel = 12 * 50                                       # divisible by 2, 3 and 4: no padding
    inputs = _inputs(world_size, numel)
    out = run_collective(ring_all_reduce, inputs)
    expected = torch.stack(inputs).sum(0)
    for rank, got in enumerate(out["outputs"]):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-6, msg=f"rank {rank}")
    size = numel * 4
    assert out["bytes_sent"] == [2 * (world_size - 1) * size // world_size] * world_size
    assert all("allreduce" not in calls for calls in out["calls"])


def _compare_with_torch(rank, world_size, numel, dtype):
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(numel, generator=g, dtype=dtype)
    ring, torch_ = RingCollectives(), TorchCollectives()
    got = {"all_reduce": ring.all_reduce(x.clone()), "reduce_scatter": ring.reduce_scatter(x.clone()),
           "all_gather": ring.all_gather(x[:numel // world_size].clone())}
    want = {"all_reduce": torch_.all_reduce(x.clone()), "reduce_scatter": torch_.reduce_scatter(x.clone()),
            "all_gather": torch_.all_gather(x[:numel // world_size].clone())}
    with count_bytes() as c:
        ring.reduce_scatter(x.clone())
    half = c.sent
    return got, want, half


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_ring_collectives_equal_torch_collectives(dtype, atol):
    world_size, numel = 4, 64
    for rank, (got, want, half) in enumerate(launch(_compare_with_torch, world_size, numel, dtype)):
        for op in got:
            torch.testing.assert_close(got[op], want[op], atol=atol, rtol=0, msg=f"{op} on rank {rank}")
        assert half == (world_size - 1) * numel * torch.tensor([], dtype=dtype).element_size() // world_size


def _uneven(rank, world_size):
    t = torch.arange(7, dtype=torch.float32) * (rank + 1)
    return ring_all_reduce(t)


def test_ring_all_reduce_pads_sizes_that_do_not_split_evenly():
    for got in launch(_uneven, 3):
        assert torch.equal(got, torch.arange(7, dtype=torch.float32) * 6)


def _single(rank, world_size):
    return ring_all_reduce(torch.ones(3)), dist.get_world_size()


def test_one_rank_is_the_identity():
    (t, n), = launch(_single, 1)
    assert n == 1 and torch.equal(t, torch.ones(3))


def _count_twice_then_all_reduce(rank, world_size):
    for _ in range(2):
        with count_bytes() as c:
            dist.all_reduce(torch.ones(2))
        assert c.calls["allreduce"] == 1
    t = torch.ones(2)
    dist.all_reduce(t)                      # the real methods are back after counting
    return t


def test_counting_restores_torch_distributed():
    assert [t.tolist() for t in launch(_count_twice_then_all_reduce, 2)] == [[2.0, 2.0]] * 2
