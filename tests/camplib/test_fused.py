"""camplib.fused: LayerNorm+GELU compiled by torch.compile equals the eager reference, and a
failed compilation is reported, never passed off as fused.

Tolerances: fp32, atol=1e-5, rtol=1e-5 (the fused kernel reorders the mean/variance reductions
and may use another tanh/erf implementation).
"""
import pytest
import torch
import torch.nn.functional as F

from camplib import fused
from camplib.fused import compile_layernorm_gelu, layernorm_gelu
from tests.support import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATOL, RTOL = 1e-5, 1e-5


def inputs(shape=(4, 8, 32), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3 + 1
    w, b = torch.randn(shape[-1], generator=g), torch.randn(shape[-1], generator=g)
    return x.to(DEVICE), w.to(DEVICE), b.to(DEVICE)


@pytest.mark.parity
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_eager_reference_is_layernorm_then_gelu(approximate):
    x, w, b = inputs()
    ln = torch.nn.LayerNorm(x.shape[-1], eps=1e-5).to(DEVICE)
    with torch.no_grad():
        ln.weight.copy_(w)
        ln.bias.copy_(b)
    expected = torch.nn.GELU(approximate=approximate)(ln(x))
    assert_close("layernorm_gelu", layernorm_gelu(x, w, b, 1e-5, approximate), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parity
def test_compiled_equals_eager():
    """Compiles once (tens of seconds on a CPU), for inputs that require grad (the graph captures
    forward and backward together), then checks values and gradients on new inputs of that shape."""
    x, w, b = (t.requires_grad_() for t in inputs())
    f = compile_layernorm_gelu(x, w, b)
    assert f.fused, f"torch.compile is expected to work on this machine: {f.reason}"
    assert f.reason == "" and f.compile_seconds > 0
    x1, w1, b1 = (t.requires_grad_() for t in inputs(seed=1))
    x2, w2, b2 = (t.detach().clone().requires_grad_() for t in (x1, w1, b1))
    out, expected = f(x1, w1, b1), layernorm_gelu(x2, w2, b2)
    assert_close("compiled output", out, expected, atol=ATOL, rtol=RTOL)
    out.square().sum().backward()
    expected.square().sum().backward()
    assert_close("compiled (x, w, b) grads", (x1.grad, w1.grad, b1.grad), (x2.grad, w2.grad, b2.grad), atol=1e-4, rtol=1e-4)


def test_disabled_compilation_says_so():
    x, w, b = inputs()
    f = compile_layernorm_gelu(x, w, b, enabled=False)
    assert not f.fused and "disabled" in f.reason
    assert_close("eager fallback", f(x, w, b), layernorm_gelu(x, w, b), atol=0, rtol=0)


def test_failed_compilation_falls_back_with_the_reason(monkeypatch):
    def broken_compile(fn, **kwargs):
        def run(*args):
            raise RuntimeError("no C++ compiler found")
        return run
    monkeypatch.setattr(fused.torch, "compile", broken_compile)
    x, w, b = inputs()
    f = compile_layernorm_gelu(x, w, b)
    assert not f.fused and "no C++ compiler found" in f.reason
    assert f.fn is layernorm_gelu
    assert_close("fallback output", f(x, w, b), F.gelu(F.layer_norm(x, (32,), w, b), approximate="tanh"))
