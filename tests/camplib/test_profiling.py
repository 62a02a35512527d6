"""camplib.profiling: the profiler table of one GPT training step names the operators that cost
(matmuls for a GPT), and the flops / MFU arithmetic against hand-computed numbers."""
import pytest
import torch

from camplib.model import GPT, GPTConfig
from camplib.profiling import flops_per_token, format_table, mfu, profile_step


def _gpt_training_step(fused: bool):
    """One training step of a one-layer GPT (AdamW, torch's fused kernel when `fused`), as a closure."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, n_layer=1, d_model=32, n_head=2, max_seq_len=16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    x = torch.randint(0, 64, (2, 16))

    def step():
        _, loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def test_profile_of_a_gpt_training_step_lists_its_costly_operators():
    step = _gpt_training_step(fused=False)
    rows = profile_step(step, warmup=1, top=1000)   # every operator: which ones lead depends on the machine's load
    assert [r.self_ms for r in rows] == sorted((r.self_ms for r in rows), reverse=True), "not sorted by self time"
    names = {r.name for r in rows}
    assert names & {"aten::mm", "aten::addmm", "aten::bmm"}, f"no matmul among {sorted(names)}"
    assert any("AdamW" in n for n in names), f"the optimizer step is missing from {sorted(names)}"
    table = format_table(rows[:8])
    assert table.splitlines()[0].startswith("operator") and len(table.splitlines()) == 9


def test_top_limits_the_rows():
    rows = profile_step(lambda: torch.ones(64).add(1).mul(2).sum(), warmup=0, top=2)
    assert len(rows) == 2, f"top=2 gave {len(rows)} rows"


def test_flops_per_token_and_mfu_by_hand():
    # GPT-2 small: N = 85M non-embedding, L 12, d 768, T 1024: 6N + 12 L d T = 510M + 113.2M
    assert flops_per_token(85_000_000, 12, 768, 1024) == 6 * 85_000_000 + 12 * 12 * 768 * 1024
    assert mfu(1000.0, 6e9, 1e13) == pytest.approx(0.6)


@pytest.mark.parametrize("call, message", [
    (lambda: flops_per_token(-1, 1, 1, 1), "n_params"),
    (lambda: flops_per_token(1, 1.5, 1, 1), "n_layer"),
    (lambda: mfu(1.0, 1.0, 0.0), "peak_flops > 0"),
    (lambda: profile_step(lambda: None, top=0), "top >= 1"),
])
def test_bad_input_is_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_op_cpu_times_counts_a_gpt_steps_operators_backward_included():
    """CPU time per aten operator of one eager GPT step: the products of forward and backward (a
    Linear's backward is two mm per weight), the fused optimizer, sorted, and less than the step. (~0.1 s)"""
    from camplib.profiling import op_cpu_times

    step = _gpt_training_step(fused=True)
    rows, total = op_cpu_times(step, warmup=1)
    calls = {r.name: r.calls for r in rows}
    # forward: qkv, proj, fc, mlp proj (addmm, with bias) and the tied head (mm); backward: a grad
    # of the input and of the weight for each (the first layer's input grad is still needed: x's embedding)
    assert calls.get("aten::addmm") == 4 and calls.get("aten::mm", 0) >= 9, f"products counted: {calls}"
    assert calls.get("aten::_fused_adamw_") == 1 and any("layer_norm_backward" in n for n in calls), calls
    assert [r.self_ms for r in rows] == sorted((r.self_ms for r in rows), reverse=True)
    assert 0 < sum(r.self_ms for r in rows) <= total, (sum(r.self_ms for r in rows), total)
