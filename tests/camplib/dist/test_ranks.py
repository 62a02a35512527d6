"""camplib.dist.on_ranks: one call, one result format ({key: [value per rank]} plus the bytes
each rank sent and the calls it made), and clear errors for rank functions that break it."""
import pytest
import torch
import torch.distributed as dist

from camplib.dist import RankError, on_ranks
from camplib.dist.ring import ring_all_reduce


def _sum_rank(rank, world_size, values):
    t = torch.tensor([float(values[rank])] * 4)
    ring_all_reduce(t)
    dist.barrier()
    return {"sum": t, "rank": rank}


def test_results_per_key_and_rank_with_bytes_and_calls():
    out = on_ranks(_sum_rank, 3, [1, 2, 4])
    assert sorted(out) == ["bytes_sent", "calls", "rank", "sum"]
    assert out["rank"] == [0, 1, 2]
    for r in range(3):
        torch.testing.assert_close(out["sum"][r], torch.full((4,), 7.0), atol=0, rtol=0)
    # ring all-reduce of 4 fp32 values (padded to 6 for 3 ranks): 2 * (N-1) chunks of 2 values
    assert out["bytes_sent"] == [2 * 2 * 2 * 4] * 3, out["bytes_sent"]
    assert all(calls["send"] == 4 and calls["barrier"] == 1 for calls in out["calls"]), out["calls"]


def _not_a_dict(rank, world_size):
    return [rank]


def _reserved_key(rank, world_size):
    return {"bytes_sent": 0}


def _keys_by_rank(rank, world_size):
    return {f"key{rank}": rank}


@pytest.mark.parametrize("fn, message", [(_not_a_dict, "returns a dict"), (_reserved_key, "fills in itself"),
                                         (_keys_by_rank, "same keys")])
def test_a_rank_function_that_breaks_the_format_gets_a_clear_error(fn, message):
    with pytest.raises((RankError, ValueError), match=message):
        on_ranks(fn, 2, timeout=20)
