"""camplib.optim (AdamW, clip_grad_norm_) and camplib.schedule, against torch's own."""
import copy
import math

import pytest
import torch
from torch import nn

from autograder.checks import check_close, check_equal
from camplib.model import GPT, GPTConfig
from camplib.optim import AdamW, PlainAdamW, clip_grad_norm_, decay_param_groups
from camplib.schedule import lr_lambda, warmup_cosine, warmup_linear, warmup_scheduler

# camplib's AdamW performs torch.optim.AdamW's single-tensor update (the CPU default) operation by
# operation, so the two are equal bit for bit (torch.equal) on the CPU, in fp32 and fp64.
STEPS = 20


def small_model(dtype, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)


def groups(model):
    """Different lr and weight decay per group, as real runs use (no decay on biases/norms)."""
    return [{"params": [model[0].weight, model[3].weight], "lr": 3e-2, "weight_decay": 0.1},
            {"params": [model[0].bias, model[3].bias, model[1].weight, model[1].bias],
             "lr": 1e-2, "weight_decay": 0.0}]


def loss_at(model, step, dtype):
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(8, 6, generator=g, dtype=dtype), torch.randn(8, 3, generator=g, dtype=dtype)
    return ((model(x) - y) ** 2).mean()


def run(model, opt, steps, dtype, start=0, trace=None):
    for step in range(start, start + steps):
        opt.zero_grad()
        loss_at(model, step, dtype).backward()
        opt.step()
        if trace is not None:
            trace.append([p.detach().clone() for p in model.parameters()])


@pytest.mark.parity
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adamw_matches_torch_step_by_step(dtype):
    ours_model, ref_model = small_model(dtype), small_model(dtype)
    kw = dict(betas=(0.9, 0.95), eps=1e-8)
    ours = AdamW(groups(ours_model), **kw)
    ref = torch.optim.AdamW(groups(ref_model), **kw)
    ours_trace, ref_trace = [], []
    run(ours_model, ours, STEPS, dtype, trace=ours_trace)
    run(ref_model, ref, STEPS, dtype, trace=ref_trace)
    for step, (a, b) in enumerate(zip(ours_trace, ref_trace), 1):
        for i, (pa, pb) in enumerate(zip(a, b)):
            check_equal(f"param {i} after step {step}", pa, pb)     # bit for bit
    # the parameters did move (a no-op optimizer would fail above only through its state)
    assert (ours_trace[-1][0] - small_model(dtype)[0].weight).abs().max() > 1e-2
    for p_ours, p_ref in zip(ours_model.parameters(), ref_model.parameters()):
        s, r = ours.state[p_ours], ref.state[p_ref]
        assert set(s) == {"step", "exp_avg", "exp_avg_sq"} and float(s["step"]) == STEPS
        check_equal("exp_avg", s["exp_avg"], r["exp_avg"])
        check_equal("exp_avg_sq", s["exp_avg_sq"], r["exp_avg_sq"])


SHAPES = [(), (7,), (5, 3), (2, 3, 4), (1, 2, 9, 2)]


@pytest.mark.parity
@pytest.mark.parametrize("betas, eps", [((0.9, 0.999), 1e-8), ((0.8, 0.95), 1e-6)])
def test_adamw_equals_torch_bit_for_bit_over_many_steps_shapes_and_a_schedule(betas, eps):
    """fp32, 200 steps, tensors of 0 to 4 dimensions, two groups (weight decay 0.1 and 0), gradients
    of widely different scales (1e-4 to 1e2) and a warm-up + cosine schedule changing lr every
    step: torch.equal after every step. The older mul_/add_ form of the first moment drifted
    from torch by ~1e-7 within 20 steps, so this fails on one rounding. (~0.3 s)"""
    gen = torch.Generator().manual_seed(7)
    start = [torch.randn(s, generator=gen) for s in SHAPES]
    scales = [1e-4, 1.0, 1e2, 3e-2, 10.0]

    def build(cls):
        params = [nn.Parameter(t.clone()) for t in start]
        opt = cls([{"params": params[:3], "weight_decay": 0.1}, {"params": params[3:], "weight_decay": 0.0}],
                  lr=1e-2, betas=betas, eps=eps)
        return params, opt, warmup_scheduler(opt, "cosine", 20, 200, final_ratio=0.1)

    (ours, ours_opt, ours_sched), (theirs, ref_opt, ref_sched) = build(AdamW), build(torch.optim.AdamW)
    for step in range(200):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            g = torch.randn(a.shape, generator=gen) * scales[i]
            a.grad, b.grad = g.clone(), g.clone()
        ours_opt.step(), ref_opt.step()
        ours_sched.step(), ref_sched.step()
        for i, (a, b) in enumerate(zip(ours, theirs)):
            check_equal(f"param of shape {tuple(a.shape)} after step {step + 1}", a.detach(), b.detach())
    for a, b in zip(ours, theirs):
        check_equal(f"exp_avg of shape {tuple(a.shape)}", ours_opt.state[a]["exp_avg"], ref_opt.state[b]["exp_avg"])
        check_equal(f"exp_avg_sq of shape {tuple(a.shape)}", ours_opt.state[a]["exp_avg_sq"],
                    ref_opt.state[b]["exp_avg_sq"])
    assert max((a - s).abs().max() for a, s in zip(ours, start)) > 0.1       # it did train


@pytest.mark.parity
def test_fused_adamw_equals_torch_fused_bit_for_bit_and_the_default_within_rounding():
    """AdamW(fused=True) (torch's fused kernel, one call per group) against
    torch.optim.AdamW(fused=True): torch.equal after each of 20 steps, two groups, fp32; against
    the default (single-tensor) path: the same update in another arithmetic order, within 2e-6
    relative on the weights (fp32 rounding, compounded over the steps). (~0.05 s)"""
    dtype = torch.float32
    models = [small_model(dtype) for _ in range(3)]
    opts = [AdamW(groups(models[0]), fused=True), torch.optim.AdamW(groups(models[1]), fused=True),
            AdamW(groups(models[2]))]
    traces = [[], [], []]
    for model, opt, trace in zip(models, opts, traces):
        run(model, opt, STEPS, dtype, trace=trace)
    for step, (ours, theirs, default) in enumerate(zip(*traces), 1):
        for i, (a, b, c) in enumerate(zip(ours, theirs, default)):
            check_equal(f"fused param {i} after step {step}", a, b)
            check_close(f"fused vs default param {i} after step {step}", a, c, atol=1e-7, rtol=2e-6)
    assert (traces[0][-1][0] - small_model(dtype)[0].weight).abs().max() > 1e-2      # it did train
    for p_ours, p_ref in zip(models[0].parameters(), models[1].parameters()):
        s, r = opts[0].state[p_ours], opts[1].state[p_ref]
        assert set(s) == {"step", "exp_avg", "exp_avg_sq"} and float(s["step"]) == STEPS
        check_equal("fused exp_avg_sq", s["exp_avg_sq"], r["exp_avg_sq"])


def test_adamw_weight_decay_is_decoupled():
    # zero gradient: Adam's step is 0, only the decay acts: p <- p * (1 - lr * wd), exactly
    p = nn.Parameter(torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64))
    opt = AdamW([p], lr=0.1, weight_decay=0.5)
    p.grad = torch.zeros_like(p)
    opt.step()
    check_close("decayed", p.detach(), torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64) * 0.95,
                atol=1e-15, rtol=0)


def test_adamw_first_step_is_lr_times_sign():
    # step 1 after bias correction: m/sqrt(v) = g/|g|, so each weight moves by lr (eps aside)
    p = nn.Parameter(torch.zeros(4, dtype=torch.float64))
    opt = AdamW([p], lr=0.01, weight_decay=0.0, eps=0.0)
    p.grad = torch.tensor([3.0, -0.001, 50.0, -7.0], dtype=torch.float64)
    opt.step()
    check_close("first step", p.detach(), -0.01 * p.grad.sign(), atol=1e-15, rtol=0)


@pytest.mark.parity
def test_adamw_state_dict_resume_is_exact_and_swaps_with_torch():
    dtype = torch.float32
    straight_model = small_model(dtype)
    straight = AdamW(groups(straight_model))
    run(straight_model, straight, STEPS, dtype)

    half_model = small_model(dtype)
    half = AdamW(groups(half_model))
    run(half_model, half, STEPS // 2, dtype)
    saved_opt, saved_model = copy.deepcopy(half.state_dict()), copy.deepcopy(half_model.state_dict())

    resumed_model = small_model(dtype, seed=1)  # different weights: everything must come from the save
    resumed_model.load_state_dict(saved_model)
    resumed = AdamW(groups(resumed_model))
    resumed.load_state_dict(copy.deepcopy(saved_opt))  # load_state_dict may share the tensors
    run(resumed_model, resumed, STEPS // 2, dtype, start=STEPS // 2)
    for i, (a, b) in enumerate(zip(resumed_model.parameters(), straight_model.parameters())):
        check_equal(f"resumed param {i}", a.detach(), b.detach())

    # our state_dict continues in torch's AdamW (same state names, same step type)
    torch_model = small_model(dtype, seed=1)
    torch_model.load_state_dict(saved_model)
    torch_opt = torch.optim.AdamW(groups(torch_model))
    torch_opt.load_state_dict(copy.deepcopy(saved_opt))
    run(torch_model, torch_opt, STEPS // 2, dtype, start=STEPS // 2)
    for i, (a, b) in enumerate(zip(torch_model.parameters(), straight_model.parameters())):
        check_equal(f"torch-resumed param {i}", a.detach(), b.detach())


def test_adamw_skips_params_without_grad():
    model = small_model(torch.float32)
    opt = AdamW(model.parameters(), lr=0.1)
    frozen_before = model[3].weight.detach().clone()
    model[3].weight.requires_grad_(False)
    loss_at(model, 0, torch.float32).backward()
    opt.step()
    check_equal("frozen weight", model[3].weight.detach(), frozen_before)
    assert model[3].weight not in opt.state


def test_decay_param_groups_on_gpt():
    model = GPT(GPTConfig.gpt2_style())  # tied lm_head / tok_emb
    decay, no_decay = decay_param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    n = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert n == model.num_parameters()  # the tied matrix once
    assert any(p is model.tok_emb.weight for p in decay["params"])


# ---- clip_grad_norm_ ---------------------------------------------------------------------
def grads_for(model, scale):
    model.zero_grad()
    (loss_at(model, 0, torch.float64) * scale).backward()


@pytest.mark.parity
@pytest.mark.parametrize("scale, max_norm", [(100.0, 1.0), (1e-3, 1.0)])  # clipped, untouched
def test_clip_grad_norm_matches_torch(scale, max_norm):
    ours_model, ref_model = small_model(torch.float64), small_model(torch.float64)
    grads_for(ours_model, scale)
    grads_for(ref_model, scale)
    before = [p.grad.clone() for p in ours_model.parameters()]
    ours = clip_grad_norm_(ours_model.parameters(), max_norm)
    ref = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), max_norm)
    check_close("total norm", ours, ref, atol=1e-12, rtol=1e-12)
    for i, (a, b) in enumerate(zip(ours_model.parameters(), ref_model.parameters())):
        check_close(f"clipped grad {i}", a.grad, b.grad, atol=1e-14, rtol=1e-12)
    after_norm = torch.sqrt(sum((p.grad ** 2).sum() for p in ours_model.parameters()))
    if float(ref) > max_norm:
        check_close("norm after clipping", after_norm, torch.tensor(max_norm, dtype=torch.float64),
                    atol=1e-5, rtol=0)  # max_norm / (norm + 1e-6): just under max_norm
    else:
        for i, (p, g) in enumerate(zip(ours_model.parameters(), before)):
            check_equal(f"unclipped grad {i}", p.grad, g)


def test_clip_grad_norm_ignores_params_without_grad():
    a, b = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))
    a.grad = torch.tensor([3.0, 0.0, 4.0])
    norm = clip_grad_norm_([a, b], 1.0)
    check_close("norm", norm, torch.tensor(5.0), atol=1e-6, rtol=0)
    check_close("clipped", a.grad, torch.tensor([0.6, 0.0, 0.8]), atol=1e-6, rtol=0)
    assert b.grad is None


# ---- schedules -----------------------------------------------------------------------------
W, T, PEAK, FINAL = 10, 110, 1e-3, 1e-4  # decay from step 10 to 110, midpoint 60


@pytest.mark.parametrize("fn, mid, quarter", [
    (warmup_linear, 5.5e-4, FINAL + (PEAK - FINAL) * 0.75),
    (warmup_cosine, 5.5e-4, FINAL + (PEAK - FINAL) * 0.5 * (1 + math.cos(math.pi / 4))),
])
def test_schedule_pinned_values(fn, mid, quarter):
    at = lambda step: fn(step, W, T, PEAK, FINAL)  # noqa: E731
    assert at(0) == 0.0                                  # the first update is lr 0
    assert at(5) == pytest.approx(PEAK / 2, rel=1e-12)   # halfway through warm-up
    assert at(W) == pytest.approx(PEAK, rel=1e-12)       # end of warm-up: the peak
    assert at(35) == pytest.approx(quarter, rel=1e-12)   # a quarter into the decay
    assert at(60) == pytest.approx(mid, rel=1e-12)       # midpoint of the decay
    assert at(T) == pytest.approx(FINAL, rel=1e-12)      # the end
    assert at(T + 1) == at(T + 1000) == pytest.approx(FINAL, rel=1e-12)  # and after it
    assert fn(0, 0, T, PEAK) == PEAK and fn(T, 0, T, PEAK) == 0.0  # no warm-up, final_lr=0
    values = [at(s) for s in range(T + 1)]
    assert all(a < b for a, b in zip(values[:W], values[1:W + 1]))   # rises during warm-up
    assert all(a > b for a, b in zip(values[W:T], values[W + 1:]))    # falls after


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError):
        warmup_cosine(0, 20, 10, 1.0)
    with pytest.raises(ValueError):
        lr_lambda("step", 1, 10)


def lrs_of(scheduler, optimizer, steps):
    out = []
    for _ in range(steps):
        out.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return out


@pytest.mark.parity
def test_cosine_matches_torch_cosine_annealing_after_warmup():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=PEAK)
    ref = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=T - W, eta_min=FINAL)
    for k, (lr,) in enumerate(lrs_of(ref, opt, T - W + 1)):  # torch's cosine is periodic after T_max
        assert warmup_cosine(W + k, W, T, PEAK, FINAL) == pytest.approx(lr, rel=1e-12, abs=0), k


@pytest.mark.parity
def test_linear_matches_torch_linear_lr_after_warmup():
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=PEAK)
    ref = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=FINAL / PEAK, total_iters=T - W)
    for k, (lr,) in enumerate(lrs_of(ref, opt, T - W + 20)):
        assert warmup_linear(W + k, W, T, PEAK, FINAL) == pytest.approx(lr, rel=1e-12, abs=0), k


@pytest.mark.parametrize("kind, fn", [("linear", warmup_linear), ("cosine", warmup_cosine)])
def test_warmup_scheduler_drives_each_group_and_resumes(kind, fn):
    p, q = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p], "lr": PEAK}, {"params": [q], "lr": 2 * PEAK}])
    sched = warmup_scheduler(opt, kind, W, T, final_ratio=FINAL / PEAK)
    got = lrs_of(sched, opt, 30)
    for step, (lr_p, lr_q) in enumerate(got):
        assert lr_p == pytest.approx(fn(step, W, T, PEAK, FINAL), rel=1e-12, abs=1e-18)
        assert lr_q == pytest.approx(fn(step, W, T, 2 * PEAK, 2 * FINAL), rel=1e-12, abs=1e-18)
    # resume: a fresh scheduler loaded from the state_dict continues where the first one was
    state = sched.state_dict()
    assert all(fn_state is None for fn_state in state["lr_lambdas"])  # nothing unpicklable inside
    opt2 = torch.optim.SGD([{"params": [p], "lr": PEAK}, {"params": [q], "lr": 2 * PEAK}])
    sched2 = warmup_scheduler(opt2, kind, W, T, final_ratio=FINAL / PEAK)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(state)
    assert lrs_of(sched2, opt2, 5) == lrs_of(sched, opt, 5)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_plain_adamw_steps_like_torch_adamw_and_imports_no_compiler(weight_decay):
    """PlainAdamW (no torch.optim.Optimizer) takes torch.optim.AdamW's steps, a parameter without a
    gradient left alone; in a fresh process it imports no torch._dynamo (what it exists to avoid)."""
    import subprocess
    import sys

    gen = torch.Generator().manual_seed(0)
    start, grads = torch.randn(2, 5, generator=gen), [torch.randn(5, generator=gen) for _ in range(4)]
    ours = [nn.Parameter(start[0].clone()), nn.Parameter(start[1].clone())]
    theirs = nn.Parameter(start[0].clone())
    ref = torch.optim.AdamW([theirs], lr=0.05, weight_decay=weight_decay)
    plain = PlainAdamW(ours, lr=0.05, weight_decay=weight_decay)
    for g in grads:
        ours[0].grad, theirs.grad = g.clone(), g.clone()
        plain.step()
        ref.step()
        plain.zero_grad()
    check_equal("PlainAdamW after 4 steps vs torch.optim.AdamW (bit for bit)", ours[0], theirs)
    check_equal("a parameter with no gradient", ours[1], start[1])
    code = ("import sys, torch; from torch import nn; from camplib.optim import PlainAdamW\n"
            "p = nn.Parameter(torch.ones(3)); o = PlainAdamW([p], lr=0.1); p.grad = torch.ones(3); o.step()\n"
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_plain_adamw_minimize_step_is_fresh_gradients_clipped_then_the_update():
    """minimize_step(loss, max_norm) = zero the gradients, backward, torch's clip_grad_norm_,
    AdamW's step; gradients left over from before do not leak into it."""
    gen = torch.Generator().manual_seed(3)
    x, w0 = torch.randn(8, 4, generator=gen), torch.randn(4, generator=gen)
    ours, theirs = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    plain, ref = PlainAdamW([ours], lr=0.1), torch.optim.AdamW([theirs], lr=0.1, weight_decay=0.0)
    ours.grad = torch.full_like(w0, 100.0)                      # stale: must be discarded
    for _ in range(3):
        got = plain.minimize_step((x @ ours).pow(2).sum(), max_norm=0.5)
        ref.zero_grad()
        loss = (x @ theirs).pow(2).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([theirs], 0.5)
        ref.step()
        check_close("minimize_step's returned loss", torch.tensor(got), loss.detach(), atol=1e-5, rtol=1e-6)
    check_close("weights after 3 minimize_steps vs zero_grad/backward/clip/AdamW", ours, theirs, atol=1e-6, rtol=1e-6)
