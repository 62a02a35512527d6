"""camplib.parallel.zero: ZeRO stages 1-3 train exactly like single-process AdamW, stage 1 like
torch's ZeroRedundancyOptimizer, hold the bytes of the paper's formula, and send 2Ψ vs 3Ψ."""
import pytest
import torch

from camplib.parallel.zero_memory import PRECISIONS, zero_memory_formula
from camplib.parallel.zero_run import (
    build_model,
    make_data,
    reference_adamw_run,
    train_optimizer_on_ranks,
    train_zero_on_ranks,
)

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
    ref = reference_adamw_run(MLP, data, steps, HYPER)
    out = train_zero_on_ranks(stage, 2, MLP, data, steps, HYPER)
    _assert_matches(out, ref, f"ZeRO-{stage}, MLP, 2 ranks")
    assert _max_param_diff(ref["params"], reference_adamw_run(MLP, data, 0, HYPER)["params"]) > 1e-3  # it trained


@pytest.mark.parity
@pytest.mark.parametrize("stage", [2, 3])
def test_gpt_with_tied_embeddings_stages_2_and_3(stage):
    """Blocks are stage 3's units; embeddings and the tied head form the root unit."""
    steps = 3
    data = make_data(GPT, steps, batch=4, seed=7, seq_len=8)
    ref = reference_adamw_run(GPT, data, steps, HYPER)
    out = train_zero_on_ranks(stage, 2, GPT, data, steps, HYPER)
    _assert_matches(out, ref, f"ZeRO-{stage}, tied GPT, 2 ranks")


def _zero_redundancy_adamw(params, **hyper):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, **hyper)


@pytest.mark.parity
def test_stage_1_equals_torch_zero_redundancy_optimizer():
    """torch's ZeRO-1 expects gradients averaged by DDP: the helper all-reduces them for it."""
    steps = 4
    data = make_data(MLP, steps, batch=8, seed=11)
    theirs = train_optimizer_on_ranks(_zero_redundancy_adamw, 2, MLP, data, steps, HYPER, average_gradients=True)
    ours = train_zero_on_ranks(1, 2, MLP, data, steps, HYPER)
    for rank in range(2):
        for name, expected in theirs["params"][rank].items():
            torch.testing.assert_close(ours["params"][rank][name], expected, atol=ATOL, rtol=RTOL,
                                       msg=lambda m: f"ZeRO-1 vs ZeroRedundancyOptimizer, rank {rank}, {name}: {m}")


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
    formula = zero_memory_formula(out["n_params"], world_size, stage, *PRECISIONS[precision])
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
    psi = sent[0]["n_params"]
    for stage, out in sent.items():
        passes = 3 if stage == 3 else 2
        for rank_bytes in out["bytes_sent"]:
            for step_bytes in rank_bytes:   # padding: at most N-1 elements per unit (3 Linear units)
                assert passes * psi * 4 / 2 <= step_bytes <= passes * (psi + 3) * 4 / 2, (stage, step_bytes, psi)
    ratio = sent[3]["bytes_sent"][0][0] / sent[1]["bytes_sent"][0][0]
    assert abs(ratio - 1.5) < 0.01, ratio
    assert sent[2]["bytes_sent"][0][0] == sent[1]["bytes_sent"][0][0] == sent[0]["bytes_sent"][0][0]
