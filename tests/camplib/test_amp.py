"""camplib.amp against torch.amp.GradScaler, step by step, and fp32 master weights.

Tolerances: the scale is compared exactly (both are fp32 powers of two); parameters in fp32 with
atol=1e-7, rtol=1e-6 (both sides run the same fp32 operations, so in practice they are equal).
"""
import math

import pytest
import torch
from torch import nn

from camplib.amp import LossScaler, MasterWeights, float_format, round_to, ulp
from tests.support import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATOL, RTOL = 1e-7, 1e-6  # fp32 parameters


def run_scaler(scaler, model, opt, batches, poison, unscale_first=False, max_norm=None):
    """One training iteration per batch: scaled backward, optional poisoned gradient (inf or NaN
    written into one element), step through the scaler, update. Returns per-step records."""
    records = []
    for (x, y), bad in zip(batches, poison):
        opt.zero_grad(set_to_none=True)
        before = [p.detach().clone() for p in model.parameters()]
        loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if bad is not None:
            model.weight.grad.view(-1)[0] = bad
        if unscale_first:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(opt)
        scaler.update()
        skipped = all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))
        records.append((scaler.get_scale(), skipped, [p.detach().clone() for p in model.parameters()]))
    return records


def twin_models(seed=0, d_in=5, d_out=3):
    torch.manual_seed(seed)
    a = nn.Linear(d_in, d_out).to(DEVICE)
    b = nn.Linear(d_in, d_out).to(DEVICE)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parity
@pytest.mark.parametrize("unscale_first", [False, True], ids=["step-unscales", "unscale-then-clip"])
def test_loss_scaler_matches_grad_scaler_step_by_step(unscale_first):
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 5, generator=gen).to(DEVICE), torch.randn(8, 3, generator=gen).to(DEVICE))
               for _ in range(14)]
    inf, nan = float("inf"), float("nan")
    # 3 clean steps grow the scale (interval 3), inf and NaN back off, and so on
    poison = [None, None, None, inf, None, nan, nan, None, None, None, None, None, None, inf]
    kwargs = dict(init_scale=2.0 ** 10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    mine_model, ref_model = twin_models()
    mine = run_scaler(LossScaler(DEVICE, **kwargs), mine_model, torch.optim.SGD(mine_model.parameters(), lr=0.1),
                      batches, poison, unscale_first, max_norm=0.5)
    ref = run_scaler(torch.amp.GradScaler(DEVICE, **kwargs), ref_model, torch.optim.SGD(ref_model.parameters(), lr=0.1),
                     batches, poison, unscale_first, max_norm=0.5)
    for step, ((s, skip, params), (rs, rskip, rparams), bad) in enumerate(zip(mine, ref, poison)):
        assert s == rs, f"step {step}: scale {s} vs GradScaler {rs}"
        assert skip == rskip == (bad is not None), f"step {step}: skipped {skip}, GradScaler {rskip}, poisoned {bad}"
        assert_close(f"parameters after step {step}", params, rparams, atol=ATOL, rtol=RTOL)
    scales = [s for s, _, _ in mine]
    assert scales[:4] == [1024.0, 1024.0, 2048.0, 1024.0]  # grew after 3 clean steps, halved on inf


@pytest.mark.parity
def test_growth_stops_at_a_finite_scale_and_states_exchange():
    kwargs = dict(init_scale=2.0 ** 127, growth_interval=1)
    results = []
    for scaler in (LossScaler(DEVICE, **kwargs), torch.amp.GradScaler(DEVICE, **kwargs)):
        p = torch.zeros(3, device=DEVICE, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.1)
        for _ in range(2):
            scaler.scale((p * 1e-30).sum()).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        results.append((scaler.get_scale(), scaler.state_dict()))
    (s, state), (rs, rstate) = results
    assert s == rs == 2.0 ** 127   # 2^128 overflows fp32: the scale stays put
    assert state == rstate
    ref = torch.amp.GradScaler(DEVICE)
    ref.load_state_dict(LossScaler(DEVICE, init_scale=8.0, growth_interval=7).state_dict())
    assert ref.get_scale() == 8.0 and ref.state_dict()["growth_interval"] == 7


def test_misuse_raises_like_grad_scaler():
    for scaler in (LossScaler(DEVICE), torch.amp.GradScaler(DEVICE)):
        p = torch.ones(2, device=DEVICE, requires_grad=True)
        opt = torch.optim.SGD([p], lr=0.1)
        scaler.scale(p.sum()).backward()
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match="already been called"):
            scaler.unscale_(opt)
        scaler.step(opt)
        with pytest.raises(RuntimeError, match="already been called"):
            scaler.step(opt)
    off = LossScaler(DEVICE, enabled=False)
    loss = torch.tensor(3.0)
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and off.state_dict() == {}


def test_fp16_gradients_must_not_be_unscaled():
    p = torch.ones(2, dtype=torch.float16, device=DEVICE, requires_grad=True)
    p.grad = torch.ones_like(p)
    scaler = LossScaler(DEVICE)
    scaler.scale(torch.tensor(1.0, device=DEVICE))
    with pytest.raises(ValueError, match="FP16"):
        scaler.unscale_(torch.optim.SGD([p], lr=0.1))


def test_master_weights_keep_small_updates_that_bf16_loses():
    """100 updates of 1e-4 on a weight of 1: bf16 (eps 2^-7 = 0.0078) rounds each one away,
    the fp32 master accumulates them (1 - 0.01 in fp32, rounded once into the model)."""
    naive = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    kept = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    naive_opt = torch.optim.SGD([naive], lr=1e-4)
    master = MasterWeights([kept], torch.optim.SGD, lr=1e-4)
    for _ in range(100):
        naive.grad = torch.ones_like(naive)
        naive_opt.step()
        kept.grad = torch.ones_like(kept)
        master.step()
    assert torch.equal(naive.detach(), torch.ones(4, dtype=torch.bfloat16))
    expected = torch.ones(4)
    for _ in range(100):
        expected -= 1e-4
    assert torch.equal(master.master_params[0].detach(), expected)
    assert torch.equal(kept.detach(), expected.to(torch.bfloat16))
    assert master.master_params[0].grad is None  # fp32 grads freed after the step


@pytest.mark.parity
def test_fp16_training_with_master_weights_matches_grad_scaler_pipeline():
    """fp16 model + fp32 masters (AdamW) + our scaler vs the same pipeline with GradScaler,
    including a step whose fp16 gradient overflows."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 2))
    gen = torch.Generator().manual_seed(3)
    data = [(torch.randn(4, 6, generator=gen), torch.randn(4, 2, generator=gen)) for _ in range(8)]
    runs = []
    for scaler in (LossScaler(DEVICE, init_scale=2.0 ** 12, growth_interval=2),
                   torch.amp.GradScaler(DEVICE, init_scale=2.0 ** 12, growth_interval=2)):
        model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 2))
        model.load_state_dict(base.state_dict())
        model = model.to(DEVICE, torch.float16)
        opt = MasterWeights(model.parameters(), torch.optim.AdamW, lr=1e-2)
        record = []
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            loss = (model(x.to(DEVICE, torch.float16)).float() - y.to(DEVICE)).pow(2).mean()
            scaler.scale(loss * (1e4 if i == 4 else 1.0)).backward()   # step 4 overflows fp16
            opt.step(scaler)
            scaler.update()
            record.append((scaler.get_scale(), [m.detach().clone() for m in opt.master_params]))
        runs.append(record)
    for step, ((s, masters), (rs, rmasters)) in enumerate(zip(*runs)):
        assert s == rs, f"step {step}: scale {s} vs {rs}"
        assert_close(f"master weights after step {step}", masters, rmasters, atol=ATOL, rtol=RTOL)
    assert runs[0][4][0] < runs[0][3][0], "the overflowing step must back off"


def test_float_formats():
    fp16, bf16 = float_format(torch.float16), float_format(torch.bfloat16)
    assert (fp16.max, fp16.smallest_normal, fp16.smallest_subnormal, fp16.eps) == (65504.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -10)
    assert (bf16.mantissa_bits, bf16.eps, bf16.smallest_normal) == (7, 2.0 ** -7, float(torch.finfo(torch.float32).tiny))
    assert round_to(1 + 2.0 ** -11, torch.float16).item() == 1.0          # a tie rounds to even
    assert round_to(1 + 3 * 2.0 ** -11, torch.float16).item() == 1 + 2.0 ** -9
    assert math.isinf(round_to(65520.0, torch.float16).item())            # past max + ulp/2: overflow
    assert round_to(2.0 ** -26, torch.float16).item() == 0.0              # below half the smallest subnormal
    assert round_to(1e30, torch.bfloat16).item() == pytest.approx(1e30, rel=2 ** -8)
    assert ulp(1000.0, torch.float16).item() == 0.5 and ulp(1.0, torch.bfloat16).item() == 2.0 ** -7
    assert ulp(1e-7, torch.float16).item() == 2.0 ** -24                  # subnormal spacing
