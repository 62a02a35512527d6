"""camplib.parallel.zero.optimizer: ZeRO stages 1-3 train exactly like single-process AdamW, stage 1 like
torch's ZeroRedundancyOptimizer, hold the bytes of the paper's formula, and send 2Ψ vs 3Ψ."""
import pytest
import torch

from camplib.parallel.model_specs import build_model
from camplib.parallel.reference import make_data, reference_run
from camplib.parallel.zero.memory import PRECISIONS, zero_memory_formula
from camplib.parallel.zero.run import train_optimizer_on_ranks, train_zero_on_ranks

HYPER = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
MLP = {"kind": "mlp", "sizes": [8, 32, 32, 4], "seed": 3}
GPT = {"kind": "gpt", "seed": 1, "config": dict(vocab_size=64, n_layer=2, n_head=2, d_model=16, max_seq_len=16)}
# fp32 state after a few AdamW steps: Adam divides by sqrt(v), so a 1e-7 difference in a
# gradient (a different summation order across ranks) can move a weight by ~1e-6
ATOL, RTOL = 1e-5, 1e-4


def _max_param_diff(params: dict, ref: dict) -> float:
    return max((params[n] - ref[n]).abs().max().item() for n in ref)


def _assert_matches(out, ref, what):
    for rank, params in enumerate(out["params"]):
        assert sorted(params) == sorted(ref["params"]), what
        for name, expected in ref["params"].items():
            torch.testing.assert_close(params[name], expected, atol=ATOL, rtol=RTOL,
                                       msg=lambda m: f"{what}, rank {rank}, {name}: {m}")
    torch.testing.assert_close(torch.tensor(out["losses"][0]), torch.tensor(ref["losses"]), atol=ATOL, rtol=RTOL)


@pytest.mark.parity
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_each_stage_equals_single_process_adamw_on_the_full_batch(stage):
    steps = 4
    data = make_data(MLP, steps, batch=8, seed=stage)
    ref = reference_run(MLP, data, steps, "adamw", HYPER)
    out = train_zero_on_ranks(stage, 2, MLP, data, steps, HYPER)
    _assert_matches(out, ref, f"ZeRO-{stage}, MLP, 2 ranks")
    assert _max_param_diff(ref["params"], reference_run(MLP, data, 0, "adamw", HYPER)["params"]) > 1e-3  # it trained


@pytest.mark.parity
@pytest.mark.parametrize("stage", [2, 3])
def test_gpt_with_tied_embeddings_stages_2_and_3(stage):
    """Blocks are stage 3's units; embeddings and the tied head form the root unit."""
    steps = 3
    data = make_data(GPT, steps, batch=4, seed=7, seq_len=8)
    ref = reference_run(GPT, data, steps, "adamw", HYPER)
    out = train_zero_on_ranks(stage, 2, GPT, data, steps, HYPER)
    _assert_matches(out, ref, f"ZeRO-{stage}, tied GPT, 2 ranks")


def _zero_redundancy_adamw(params, **hyper):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, **hyper)


@pytest.mark.parity
def test_stage_1_equals_torch_zero_redundancy_optimizer():
    """The default optimizer, camplib's AdamW (the lesson), against ZeroRedundancyOptimizer over
    torch.optim.AdamW: equal bit for bit (camplib.optim performs torch's update op by op). torch's
    ZeRO-1 expects gradients averaged by DDP: the helper all-reduces them for it."""
    steps = 4
    data = make_data(MLP, steps, batch=8, seed=11)
    theirs = train_optimizer_on_ranks(_zero_redundancy_adamw, 2, MLP, data, steps, HYPER, average_gradients=True)
    ours = train_zero_on_ranks(1, 2, MLP, data, steps, HYPER)
    for rank in range(2):
        for name, expected in theirs["params"][rank].items():
            assert torch.equal(ours["params"][rank][name], expected), (
                f"ZeRO-1 vs ZeroRedundancyOptimizer, rank {rank}, {name}: "
                f"max |difference| {(ours['params'][rank][name] - expected).abs().max().item():.3g}")


def _zero_redundancy(optimizer_class):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    def build(params, **hyper):
        return ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class, **hyper)
    return build


# torch.optim classes with their keyword arguments, as ZeroRedundancyOptimizer takes them
TORCH_OPTIMIZERS = {
    "AdamW": (torch.optim.AdamW, dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)),
    "SGD+momentum": (torch.optim.SGD, dict(lr=5e-2, momentum=0.9, weight_decay=1e-3)),
}


@pytest.mark.parity
@pytest.mark.parametrize("optimizer", sorted(TORCH_OPTIMIZERS))
def test_any_torch_optimizer_class_equals_zero_redundancy_optimizer_bit_for_bit(optimizer):
    """ZeroAdamW(optimizer_class=..., **kwargs) shards the state of the torch optimizer it is given,
    and every stage trains exactly as torch's ZeroRedundancyOptimizer wrapping the same class (DDP-
    averaged gradients) on 2 gloo ranks: equal bit for bit after every step. With 2 ranks, the
    gradient sums (a + b) and the halving are exact whatever the collective; the optimizers are
    element-wise, so stepping a flat shard rounds as stepping whole tensors. Stage 1's state is
    sharded: each rank holds about half of it. (~8 s: 5 runs of 2 ranks)"""
    cls, kwargs = TORCH_OPTIMIZERS[optimizer]
    steps = 4
    data = make_data(MLP, steps, batch=8, seed=13)
    theirs = train_optimizer_on_ranks(_zero_redundancy(cls), 2, MLP, data, steps, kwargs, average_gradients=True,
                                      record_history=True)
    for stage in range(4):
        ours = train_zero_on_ranks(stage, 2, MLP, data, steps, dict(kwargs, optimizer_class=cls), record_history=True)
        for rank in range(2):
            for step in range(steps):
                for name, expected in theirs["history"][rank][step].items():
                    got = ours["history"][rank][step][name]
                    assert torch.equal(got, expected), (
                        f"{optimizer}, ZeRO-{stage} vs ZeroRedundancyOptimizer, rank {rank}, step {step + 1}, {name}: "
                        f"max |difference| {(got - expected).abs().max().item():.3g}")
        if stage == 1:
            psi = ours["n_params"][0]
            state_per_param = 8 if cls is torch.optim.AdamW else 4      # m and v, or the momentum buffer
            for rank, held in enumerate(ours["memory"]):
                assert held["optimizer"] <= state_per_param * psi / 2 + 64, (optimizer, rank, held, psi)
    moved = max((theirs["params"][0][n] - p).abs().max().item() for n, p in build_model(MLP).named_parameters())
    assert moved > 1e-2, moved


def _torch_adamw(params, **hyper):
    return torch.optim.AdamW(params, **hyper)


def test_optimizer_state_held_is_measured_whatever_the_optimizer_object():
    """reachable_tensor_bytes (the a02 grader's sharding check) sees AdamW's m and v: 8 bytes per
    parameter per rank unsharded; ZeroRedundancyOptimizer splits them (by whole tensors) across
    ranks, so the ranks together hold the same 8 bytes per parameter."""
    data = make_data(MLP, 1, batch=8, seed=3)
    psi = sum(p.numel() for p in build_model(MLP).parameters())
    step_counters = 4 * len(list(build_model(MLP).parameters()))     # one fp32 scalar per tensor
    full = train_optimizer_on_ranks(_torch_adamw, 2, MLP, data, 1, HYPER, average_gradients=True)
    assert full["state_bytes_held"] == [8 * psi + step_counters] * 2
    sharded = train_optimizer_on_ranks(_zero_redundancy_adamw, 2, MLP, data, 1, HYPER, average_gradients=True)
    assert sum(sharded["state_bytes_held"]) == 8 * psi + step_counters
    assert max(sharded["state_bytes_held"]) < 8 * psi


# Big enough that padding to a multiple of N and the 4-byte step counters are far below 5%.
MEMORY_MLP = {"kind": "mlp", "sizes": [64, 256, 256, 64], "seed": 0}


def _check_memory(out, stage, world_size, precision):
    formula = zero_memory_formula(out["n_params"][0], world_size, stage, *PRECISIONS[precision])
    for rank, held in enumerate(out["memory"]):
        for part in ("params", "grads", "optimizer", "total"):
            ratio = held[part] / formula[part]
            assert abs(ratio - 1) < 0.05, (f"ZeRO-{stage} {precision} N={world_size} rank {rank} {part}: "
                                           f"held {held[part]} bytes, formula {formula[part]:.0f} (ratio {ratio:.4f})")


@pytest.mark.parity
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_bytes_held_per_rank_match_the_paper_for_2_ranks(precision):
    """fp32: (4 + 4 + 8)Ψ split per stage; mixed bf16 params/grads, fp32 master+m+v: (2 + 2 + 12)Ψ."""
    spec = dict(MEMORY_MLP, dtype="float32" if precision == "fp32" else "bfloat16")
    data = make_data(spec, 1, batch=4)
    for stage in range(4):
        _check_memory(train_zero_on_ranks(stage, 2, spec, data, 1, HYPER), stage, 2, precision)


@pytest.mark.parity
def test_bytes_held_per_rank_match_the_paper_for_4_ranks_mixed_precision():
    spec = dict(MEMORY_MLP, dtype="bfloat16")
    data = make_data(spec, 1, batch=4)
    for stage in (1, 3):
        _check_memory(train_zero_on_ranks(stage, 4, spec, data, 1, HYPER), stage, 4, "mixed")


def test_communication_per_step_is_2_psi_for_stages_0_to_2_and_3_psi_for_stage_3():
    """Measured on the ring (every byte a visible send), fp32: each rank sends (N-1)/N of the
    padded flat size per reduce-scatter or all-gather. Stages 0-2: 2 passes; stage 3: 3 (the
    all-gather before forward and again before backward, plus the reduce-scatter)."""
    data = make_data(MLP, 2, batch=8)
    sent = {stage: train_zero_on_ranks(stage, 2, MLP, data, 2, HYPER, ring=True) for stage in range(4)}
    psi = sent[0]["n_params"][0]
    for stage, out in sent.items():
        passes = 3 if stage == 3 else 2
        for rank_bytes in out["bytes_per_step"]:
            for step_bytes in rank_bytes:   # padding: at most N-1 elements per unit (3 Linear units)
                assert passes * psi * 4 / 2 <= step_bytes <= passes * (psi + 3) * 4 / 2, (stage, step_bytes, psi)
    ratio = sent[3]["bytes_per_step"][0][0] / sent[1]["bytes_per_step"][0][0]
    assert abs(ratio - 1.5) < 0.01, ratio
    assert sent[2]["bytes_per_step"][0][0] == sent[1]["bytes_per_step"][0][0] == sent[0]["bytes_per_step"][0][0]


@pytest.mark.parity
def test_fp64_model_gets_fp64_masters_and_mixed_precision_fp32_masters():
    """master_dtype=None keeps the parameters' dtype when it is fp32 or wider: an fp64 model
    trains in fp64 (equal to single-process fp64 AdamW to 1e-12; fp32 masters would miss by
    ~1e-7), bf16 parameters get fp32 masters."""
    spec = dict(MLP, dtype="float64")
    data = make_data(spec, 3, batch=8, seed=5)
    ref = reference_run(spec, data, 3, "adamw", HYPER)
    for stage in (1, 2, 3):
        out = train_zero_on_ranks(stage, 2, spec, data, 3, HYPER)
        assert out["master_dtypes"] == [["float64"]] * 2, (stage, out["master_dtypes"])
        for rank, params in enumerate(out["params"]):
            for name, expected in ref["params"].items():
                assert params[name].dtype == torch.float64, (stage, rank, name, params[name].dtype)
                torch.testing.assert_close(params[name], expected, atol=1e-12, rtol=1e-10,
                                           msg=lambda m: f"fp64 ZeRO-{stage}, rank {rank}, {name}: {m}")
    mixed = train_zero_on_ranks(2, 2, dict(MLP, dtype="bfloat16"), make_data(MLP, 1, batch=8), 1, HYPER)
    assert mixed["master_dtypes"] == [["float32"]] * 2, mixed["master_dtypes"]


# 8 equal layers of 64x64 (+ bias): 16,640 bytes each in fp32, 133,120 in all. Buckets of 16 KiB
# close after one layer (weight + bias), so ZeRO-2 holds one layer's gradients at a time.
DEEP_MLP = {"kind": "mlp", "sizes": [64] * 9, "seed": 0}
LAYER_BYTES = (64 * 64 + 64) * 4


@pytest.mark.parametrize("world_size", [2, 4])
def test_zero2_peak_gradient_memory_is_the_shard_plus_one_bucket(world_size):
    """Measured from outside the optimizer during backward (every .grad and gradient buffer,
    right after each gradient is accumulated): ZeRO-2 holds at most its gradient shard (Ψ/N)
    plus one bucket of full gradients; ZeRO-1 holds the full gradients (Ψ). Keeping every full
    gradient until the end of backward would fail the first bound by ~Ψ/2."""
    data = make_data(DEEP_MLP, 1, batch=8)
    hyper = dict(HYPER, bucket_mb=16 / 1024)
    full = sum(p.numel() for p in build_model(DEEP_MLP).parameters()) * 4
    shard = full / world_size
    stage2 = train_zero_on_ranks(2, world_size, DEEP_MLP, data, 1, hyper)["peak_grad_bytes"]
    for rank, peak in enumerate(stage2):
        bound = shard + LAYER_BYTES + 4 * world_size * 8    # + padding: N-1 elements per bucket
        assert peak <= bound, (f"ZeRO-2, N={world_size}, rank {rank}: {peak} bytes of gradients held at the "
                               f"peak, more than the shard ({shard:.0f}) + one bucket ({LAYER_BYTES}); full: {full}")
        assert peak >= shard + LAYER_BYTES, (world_size, rank, peak)   # it did hold a bucket's full gradients
    stage1 = train_zero_on_ranks(1, world_size, DEEP_MLP, data, 1, hyper)["peak_grad_bytes"]
    assert all(peak >= full for peak in stage1), stage1
