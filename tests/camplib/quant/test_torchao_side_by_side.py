"""camplib.quant side by side with torchao 0.18 on the CPU: int8 weight-only, int8 dynamic
activation + int8 weight, and QAT fake quantization (int8 per channel, int4 per group of 32).

torchao never enters this process: `make setup` installs it, --no-deps, into
`.venv/reference-only/` (not on sys.path: once importable, transformers and peft import it, and it
prints to stderr as it loads, which nbgrader scores as a failed cell). One subprocess with that
folder on PYTHONPATH runs tests/camplib/quant/torchao_reference.py, which rebuilds the inputs from
the same seeds and saves torchao's codes, scales and outputs with torch.save; the comparisons run
here. Without the folder the tests are not run, loudly: a skip with the install command and a
warning, or a failure under CI (as tests/browser does without Chromium).

The conventions, read from torchao's source (quant_primitives.choose_qparams_affine,
_quantize_affine_no_dtype_cast, int8_tensor.Int8Tensor, qat.IntxFakeQuantizer), with
amax = max |w| over the slice (a row, or a group of 32 of a row):

- torchao symmetric b-bit: s_t = max(amax / ((qmax - qmin) / 2), eps) = amax / 127.5 for int8,
  amax / 7.5 for int4; codes q = clamp(round(w * (1/s_t)), qmin, qmax) in the *full* two's
  complement range [-128, 127] ([-8, 7]); w_hat = q * s_t. So -amax maps to -127.5 -> -128
  (ties to even) and +amax to 127.5 -> 128, clipped to 127 (an error of s_t / 2, like any other).
- camplib (formats.quantize_absmax, QuantLinear "int8", QATLinear): s_c = amax / qmax = amax / 127,
  codes clamp(round(w / s_c), -127, 127) (one code unused, nothing ever clipped); w_hat = q * s_c.
  So s_c / s_t = 127.5 / 127 (to 1 ulp), and the codes differ by at most 1.
- Given torchao's scale, camplib's quantize_absmax(w, scale=s_t) gives torchao's codes clamped to
  [-127, 127], except where w / s_t and w * (1/s_t) round to different sides of a tie (1 element
  in 65536 here); camplib's dequantize_absmax of torchao's codes equals torchao's dequantize() bit
  for bit.
- Dynamic activations (Int8DynamicActivationInt8WeightConfig): the same torchao rule per token
  (s_x = amax_token / 127.5, codes [-128, 127]); y = (int32 (x_q @ w_q^T) * s_x) * s_w + bias.
  Rebuilt from those formulas here it equals torchao bit for bit; camplib's convention (amax / 127
  for both) differs, and both are within the rounding bound of fp32 stated in `rounding_bound`.
- QAT (IntxFakeQuantizer): the forward is quantize-dequantize with torchao's scale and range;
  camplib.quant.qat.fake_quantize given that scale and range [qmin, qmax] equals it bit for bit.
  The straight-through gradients have the same zeros (torchao's clipped +amax included), but
  torchao's chain rule multiplies by s then by 1/s: grad_t = (g * s) * (1/s) where camplib passes
  g unchanged; that relation holds bit for bit (within 2 ulp of g).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from camplib.quant.formats import dequantize_absmax, grouped, quantize_absmax
from camplib.quant.layers import QuantLinear
from camplib.quant.qat import fake_quantize
from tests.camplib.quant.torchao_reference import GROUP_SIZE, SHAPES, inputs
from tests.support import ROOT, assert_close, not_run

pytestmark = pytest.mark.parity

TORCHAO_VERSION = "0.18.0"   # the Makefile's REFERENCE_WHEELS pins the same
SCRIPT = Path(__file__).with_name("torchao_reference.py")


def reference_only_dir() -> Path:
    """Where `make setup` installs reference-only packages: .venv/reference-only (or CAMP_REFERENCE_ONLY)."""
    return Path(os.environ.get("CAMP_REFERENCE_ONLY") or Path(sys.prefix) / "reference-only")


def _not_run(reason: str):
    message = (f"TORCHAO COMPARISONS NOT RUN: {reason}; install it with `make setup`, or: "
               f"{sys.executable} -m pip install --no-deps --target {reference_only_dir()} torchao=={TORCHAO_VERSION}")
    not_run(message, " (CI must run them)")


@pytest.fixture(scope="module")
def torchao_results(tmp_path_factory) -> dict:
    folder = reference_only_dir()
    if not (folder / "torchao").is_dir():
        _not_run(f"no torchao in {folder}")
    out = tmp_path_factory.mktemp("torchao") / "results.pt"
    env = {**os.environ, "PYTHONPATH": str(folder), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"torchao_reference.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    results = torch.load(out, weights_only=True)
    assert results["version"] == TORCHAO_VERSION, f"{folder} holds torchao {results['version']}, expected {TORCHAO_VERSION}"
    return results


def linear(name: str) -> tuple[nn.Linear, dict]:
    t = inputs(name)
    layer = nn.Linear(*reversed(SHAPES[name]))
    with torch.no_grad():
        layer.weight.copy_(t["weight"])
        layer.bias.copy_(t["bias"])
    return layer, t


def rounding_bound(x, x_hat, s_x, w_hat, s_w):
    """|x_hat @ w_hat^T - x @ w^T| <= (s_x / 2) |w_hat| summed + |x| (s_w / 2) summed, per output,
    since every quantized value is within half a step of its original (clipped ones included);
    plus 1e-4 for fp32 rounding of the sums (outputs are O(1))."""
    bound = (s_x / 2) * w_hat.abs().sum(dim=1) + x.abs().sum(dim=1, keepdim=True) * (s_w.reshape(1, -1) / 2)
    return bound + 1e-4


def test_torchao_is_not_importable_here():
    """The design's premise: the course's processes cannot import torchao (transformers would)."""
    import importlib.util
    assert importlib.util.find_spec("torchao") is None and "torchao" not in sys.modules


def test_missing_torchao_skips_loudly_or_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.warns(UserWarning, match="TORCHAO COMPARISONS NOT RUN: nope.*--target"), \
            pytest.raises(pytest.skip.Exception, match="TORCHAO COMPARISONS NOT RUN"):
        _not_run("nope")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="TORCHAO COMPARISONS NOT RUN"):
        _not_run("nope")


@pytest.mark.parametrize("name", SHAPES)
def test_int8_weight_only_codes_and_scales(torchao_results, name):
    r = torchao_results[name]["weight_only"]
    w = inputs(name)["weight"]
    assert r["type"] == "Int8Tensor" and r["qdata"].dtype == torch.int8 and torch.all(r["zero_point"] == 0)
    amax = w.abs().amax(dim=1, keepdim=True)
    assert torch.equal(r["scale"], amax / 127.5), "torchao's int8 scale is amax / 127.5 per row"
    q_c, s_c = quantize_absmax(w, 8, "channel")
    assert torch.equal(s_c, amax / 127)
    assert_close("s_c / s_t", s_c / r["scale"], torch.full_like(s_c, 127.5 / 127), atol=0, rtol=3e-7)
    q_t = r["qdata"]
    assert q_t.min() == -128 and q_t.max() == 127 and q_c.min() >= -127
    assert (q_t.int() - q_c.int()).abs().max() <= 1
    # camplib given torchao's scale: torchao's codes clamped to [-127, 127], but for rounding ties
    q_same, _ = quantize_absmax(w, 8, "channel", scale=r["scale"])
    differ = q_same != q_t.clamp(-127, 127)
    assert differ.sum() <= 2 and (q_same.int() - q_t.int()).abs().max() <= 1
    at_tie = (w / r["scale"])[differ]
    assert torch.all((at_tie - at_tie.floor() - 0.5).abs() < 1e-4), at_tie
    assert torch.equal(dequantize_absmax(q_t, r["scale"], "channel"), r["dequantized"])


@pytest.mark.parametrize("name", SHAPES)
def test_int8_weight_only_linear_outputs(torchao_results, name):
    r = torchao_results[name]["weight_only"]
    layer, t = linear(name)
    x = t["x"]
    with torch.no_grad():
        ref, mine = layer(x), QuantLinear(layer, "int8")(x)
    s_c = quantize_absmax(t["weight"], 8, "channel")[1]
    zero = torch.zeros(x.shape[0], 1)
    for what, out, s in (("camplib", mine, s_c), ("torchao", r["out"], r["scale"])):
        err = (out - ref).abs()
        assert torch.all(err <= rounding_bound(x, x, zero, t["weight"], s)), f"{what}: {err.max()}"
    # measured 0.030 (outputs up to 3.7; each side 0.025-0.031 from fp32): different grids, not a bug
    assert_close("camplib vs torchao", mine, r["out"], atol=0.08, rtol=0)
    # torchao's matmul (x @ q^T, then * s) vs F.linear on its dequantized weight: fp32 rounding only
    assert_close("F.linear(x, torchao's w_hat)", F.linear(x, r["dequantized"], t["bias"]), r["out"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", SHAPES)
def test_int8_dynamic_activation_int8_weight(torchao_results, name):
    r, wo = torchao_results[name]["dynamic"], torchao_results[name]["weight_only"]
    layer, t = linear(name)
    x, bias = t["x"], t["bias"]
    assert torch.equal(r["qdata"], wo["qdata"]) and torch.equal(r["scale"], wo["scale"])
    with torch.no_grad():
        ref = layer(x)
    # from scratch, camplib's convention: absmax / 127 per token and per output channel
    x_q, s_x = quantize_absmax(x, 8, "channel")
    w_q, s_w = quantize_absmax(t["weight"], 8, "channel")
    acc = x_q.float() @ w_q.float().t()                      # exact: |sum| <= 127^2 * 512 < 2^24
    mine = acc * s_x * s_w.t() + bias
    # torchao's convention, rebuilt: s = amax / 127.5, codes [-128, 127], (acc * s_x) * s_w
    s_xt = x.abs().amax(dim=1, keepdim=True) / 127.5
    x_qt = torch.clamp(torch.round(x * (1.0 / s_xt)), -128, 127)
    rebuilt = (x_qt @ wo["qdata"].float().t()) * s_xt * wo["scale"].t() + bias
    assert torch.equal(rebuilt, r["out"]), (rebuilt - r["out"]).abs().max()
    for what, out, sx, xq, wq, sw in (("camplib", mine, s_x, x_q * s_x, w_q * s_w, s_w),
                                      ("torchao", r["out"], s_xt, x_qt * s_xt, r["dequantized"], wo["scale"])):
        err = (out - ref).abs()
        assert torch.all(err <= rounding_bound(x, xq, sx, wq, sw)), f"{what}: {err.max()}"
    # measured 0.042 (each side 0.031-0.041 from fp32)
    assert_close("camplib vs torchao", mine, r["out"], atol=0.1, rtol=0)


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("key, bits, group", [("qat_int8_channel", 8, "channel"), ("qat_int4_group", 4, GROUP_SIZE)])
def test_qat_fake_quantization(torchao_results, name, key, bits, group):
    r = torchao_results[name][key]
    t = inputs(name)
    w, g = t["weight"], t["grad"]
    qmin, qmax = -2 ** (bits - 1), 2 ** (bits - 1) - 1
    amax = grouped(w, group).abs().amax(dim=1, keepdim=True)
    s = r["scale"].reshape(-1, 1)
    assert torch.equal(s, amax / ((qmax - qmin) / 2)) and torch.all(r["zero_point"] == 0)
    # camplib's fake_quantize (one scale per call) with torchao's scale and range, slice by slice
    leaf = w.clone().requires_grad_(True)
    slices = grouped(leaf, group)
    fq = torch.stack([fake_quantize(slices[i], float(s[i]), 0, qmin, qmax) for i in range(len(slices))]).reshape(w.shape)
    fq.backward(g)
    assert torch.equal(fq.detach(), r["forward"])
    assert torch.equal(leaf.grad == 0, r["grad"] == 0)
    clipped = (r["grad"] == 0).sum()
    assert 0 < clipped <= len(slices)                        # only +amax is clipped (127.5 -> 127)
    s_full = s.expand(-1, slices.shape[1]).reshape(w.shape)
    assert torch.equal((leaf.grad * s_full) * (1.0 / s_full), r["grad"])
    assert_close("torchao STE grad", r["grad"], leaf.grad, atol=0, rtol=2.4e-7)
    # camplib's own convention (QATLinear's rule per slice: amax / qmax, [-qmax, qmax]): nothing
    # clipped, the gradient is g itself; both forwards within half a step of w (+ fp32 rounding:
    # torchao's clipped +amax lands 127 * s_t from 0, s_t = fl(amax / 127.5), about 1e-8 past s_t / 2)
    own = w.clone().requires_grad_(True)
    own_slices = grouped(own, group)
    s_c = amax / qmax
    fq_c = torch.stack([fake_quantize(own_slices[i], float(s_c[i]), 0, -qmax, qmax)
                        for i in range(len(own_slices))]).reshape(w.shape)
    fq_c.backward(g)
    assert torch.equal(own.grad, g)
    s_c_full = s_c.expand(-1, slices.shape[1]).reshape(w.shape)
    assert torch.all((fq_c.detach() - w).abs() <= s_c_full / 2 + 1e-7)
    assert torch.all((r["forward"] - w).abs() <= s_full / 2 + 1e-7)
