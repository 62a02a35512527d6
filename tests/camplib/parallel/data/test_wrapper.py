"""camplib.parallel.DataParallel against one process training on the full batch, and against
torch's DistributedDataParallel from the same initial weights and data.

Tolerances: fp32, SGD, 3 steps: atol 1e-6, rtol 0 (the only difference from the full batch is
the order of the sums: the mean of N shard means instead of one mean). Results that differ only
in how gradients are cut into buckets must be bitwise equal (2 ranks: a + b is exact).
"""
import functools

import pytest
import torch

from camplib.dist.ring import RingCollectives
from camplib.parallel.data.wrapper import DataParallel, make_buckets
from camplib.parallel.model_specs import build_model
from camplib.parallel.data.run import train_on_ranks, train_reference

ATOL, RTOL = 1e-6, 0.0
MLP = {"kind": "mlp", "sizes": [8, 32, 32, 4]}
GPT_TINY = {"kind": "gpt", "config": {"vocab_size": 32, "n_layer": 1, "n_head": 2, "d_model": 16, "max_seq_len": 16}}


def mlp_batch(rows=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 8, generator=g), torch.randn(rows, 4, generator=g)


def assert_params_close(what, got: dict, expected: dict, atol=ATOL, rtol=RTOL):
    assert sorted(got) == sorted(expected), what
    for name in expected:
        diff = (got[name] - expected[name]).abs().max().item()
        assert torch.allclose(got[name], expected[name], atol=atol, rtol=rtol), \
            f"{what}: parameter {name} differs by {diff:.3g} (atol {atol}, rtol {rtol})"


def n_buckets_expected(model_cfg, bucket_mb):
    """DDP's rule, written out again: reverse parameter order, close a bucket once it holds
    at least bucket_mb megabytes."""
    sizes = [p.numel() * p.element_size() for p in build_model(model_cfg, 0).parameters()][::-1]
    count, filled = 0, None
    for s in sizes:
        if filled is None or filled >= bucket_mb * 2**20:
            count, filled = count + 1, 0
        filled += s
    return count


@pytest.mark.parity
def test_two_ranks_equal_single_process_full_batch():
    x, y = mlp_batch()
    ref = train_reference(MLP, x, y, steps=3, lr=0.1, seed=0)
    out = train_on_ranks(DataParallel, 2, MLP, x, y, steps=3, lr=0.1, seed=0)
    for rank in range(2):
        assert_params_close(f"rank {rank} after 3 steps", out["params"][rank], ref["params"])
        # each rank's loss is its shard's mean; their average is the full batch's loss
    mean_losses = torch.tensor(out["losses"]).mean(0)
    assert torch.allclose(mean_losses, torch.tensor(ref["losses"]), atol=1e-6, rtol=0), (mean_losses, ref["losses"])


@pytest.mark.parity
def test_four_ranks_gpt_equal_single_process_full_batch():
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 32, (8, 8), generator=g), torch.randint(0, 32, (8, 8), generator=g)
    ref = train_reference(GPT_TINY, x, y, steps=2, lr=0.05, seed=3)
    out = train_on_ranks(DataParallel, 4, GPT_TINY, x, y, steps=2, lr=0.05, seed=3, bucket_mb=0.005)
    for rank in range(4):
        assert_params_close(f"GPT, rank {rank} of 4", out["params"][rank], ref["params"])


@pytest.mark.parity
def test_matches_torch_distributed_data_parallel():
    x, y = mlp_batch(seed=2)
    ours = train_on_ranks(DataParallel, 2, MLP, x, y, steps=3, lr=0.1, seed=5, bucket_mb=0.001)
    ddp = train_on_ranks("ddp", 2, MLP, x, y, steps=3, lr=0.1, seed=5, bucket_mb=0.001)
    for rank in range(2):
        assert_params_close(f"rank {rank}: DataParallel vs DistributedDataParallel", ours["params"][rank],
                            ddp["params"][rank])
    assert torch.allclose(torch.tensor(ours["losses"]), torch.tensor(ddp["losses"]), atol=1e-6, rtol=0)


def test_bucket_size_changes_the_number_of_all_reduces_not_the_result():
    x, y = mlp_batch(seed=3)
    n_params = len(list(build_model(MLP, 0).parameters()))
    results = {}
    for bucket_mb in (0.0, 0.004, 25.0):
        out = train_on_ranks(DataParallel, 2, MLP, x, y, steps=2, lr=0.1, bucket_mb=bucket_mb)
        expected = n_buckets_expected(MLP, bucket_mb)
        for rank in range(2):
            assert out["calls"][rank].get("allreduce", 0) == 2 * expected, (bucket_mb, out["calls"][rank])
            assert out["calls"][rank].get("broadcast", 0) == n_params, out["calls"][rank]
        results[bucket_mb] = out["params"][0]
    assert (n_buckets_expected(MLP, 0.0), n_buckets_expected(MLP, 25.0)) == (n_params, 1)
    assert 1 < n_buckets_expected(MLP, 0.004) < n_params
    for bucket_mb, params in results.items():
        for name, value in params.items():
            assert torch.equal(value, results[25.0][name]), f"bucket_mb={bucket_mb}: {name} differs"


def test_buckets_follow_reverse_parameter_order():
    model = build_model(MLP, 0)
    params = list(model.parameters())
    buckets = make_buckets(params[::-1], 2000)
    assert [p for b in buckets for p in b.params] == params[::-1]
    assert all(b.nbytes >= 2000 for b in buckets[:-1])
    assert all(sum(p.numel() * 4 for p in b.params[:-1]) < 2000 for b in buckets)  # closed as soon as full


@pytest.mark.parity
def test_no_sync_accumulates_micro_batches():
    x, y = mlp_batch(seed=4)
    ref = train_reference(MLP, x, y, steps=2, lr=0.1)
    out = train_on_ranks(DataParallel, 2, MLP, x, y, steps=2, lr=0.1, micro_batches=4, bucket_mb=0.0)
    for rank in range(2):
        assert_params_close(f"rank {rank}, 4 micro-batches per rank", out["params"][rank], ref["params"])
        # no communication inside no_sync(): one all-reduce per bucket per optimizer step
        assert out["calls"][rank]["allreduce"] == 2 * n_buckets_expected(MLP, 0.0), out["calls"][rank]


def test_broadcast_makes_rank_dependent_inits_equal_to_rank_0():
    x, y = mlp_batch(seed=5)
    alone = train_on_ranks(None, 2, MLP, x, y, steps=1, seed=7)
    assert not torch.equal(alone["initial"][0]["0.weight"], alone["initial"][1]["0.weight"]), \
        "the ranks' models must start different, or this test proves nothing"
    out = train_on_ranks(DataParallel, 2, MLP, x, y, steps=1, seed=7)
    rank0_init = dict(build_model(MLP, 7).named_parameters())
    for rank in range(2):
        for name, value in out["initial"][rank].items():
            assert torch.equal(value, rank0_init[name].detach()), f"rank {rank}: {name} is not rank 0's"


@pytest.mark.parity
def test_ring_collectives_give_the_same_training():
    x, y = mlp_batch(seed=6)
    ring = train_on_ranks(functools.partial(DataParallel, collectives=RingCollectives()), 2, MLP, x, y,
                          steps=2, lr=0.1, bucket_mb=0.004)
    ref = train_reference(MLP, x, y, steps=2, lr=0.1)
    for rank in range(2):
        assert_params_close(f"rank {rank} on the ring", ring["params"][rank], ref["params"])
        assert ring["calls"][rank].get("allreduce", 0) == 0 and ring["calls"][rank]["send"] > 0


def test_timeline_has_one_event_per_bucket_and_step():
    x, y = mlp_batch(seed=7)
    out = train_on_ranks(DataParallel, 2, MLP, x, y, steps=2, bucket_mb=0.004)
    events = out["timeline"][0]
    assert len(events) == 2 * n_buckets_expected(MLP, 0.004)
    for e in events:
        assert 0 <= e["ready"] <= e["comm_start"] <= e["comm_end"], e
    # buckets are launched in the order their gradients become ready: bucket 0 (the last layer) first
    assert [e["bucket"] for e in events if e["step"] == 0] == sorted(e["bucket"] for e in events if e["step"] == 0)
