"""camplib.activations: SiLU written out, SwiGLU's gate on torch's SiLU kernel (what the
model trains on), and GPT-2's tanh GELU as x * sigmoid(2 z), against torch.nn.functional and the
written-out form."""
import pytest
import torch
import torch.nn.functional as F

from autograder.checks import check_close
from camplib.activations import SiLU, gelu, gelu_tanh, silu, swiglu
from camplib.model import MLP, GPTConfig, SwiGLU

SILU_TOL = {torch.float64: (1e-14, 1e-14), torch.float32: (1e-6, 2e-6),
            torch.bfloat16: (1e-2, 8e-3), torch.float16: (1e-3, 1e-3)}


def probe(dtype, gen):
    """Random values over SiLU's interesting range, the tails (exp overflows at -1e4), its minimum
    (-1.278) and zero."""
    x = torch.cat([torch.randn(4000, generator=gen) * 6,
                   torch.tensor([-1e4, -100.0, -20.0, -1.278, -0.0, 0.0, 1e-30, 20.0, 100.0, 1e4])])
    return x.to(dtype), torch.randn(x.shape, generator=gen).to(dtype)


def values_and_grads(fn, x, grad_out):
    leaf = x.clone().requires_grad_()
    y = fn(leaf)
    y.backward(grad_out)
    return y, leaf.grad


@pytest.mark.parity
@pytest.mark.parametrize("dtype", sorted(SILU_TOL, key=str))
def test_silu_matches_torch_values_and_gradients(dtype):
    """camplib.activations.silu / SiLU against torch.nn.functional.silu: values and gradients. (~0.01 s)"""
    x, grad_out = probe(dtype, torch.Generator().manual_seed(0))
    (y, gx), (y_ref, gx_ref) = values_and_grads(silu, x, grad_out), values_and_grads(F.silu, x, grad_out)
    atol, rtol = SILU_TOL[dtype]
    assert y.dtype == dtype and gx.dtype == dtype
    check_close(f"silu({dtype})", y, y_ref, atol=atol, rtol=rtol)
    check_close(f"d silu / dx ({dtype})", gx, gx_ref, atol=atol, rtol=rtol)
    check_close(f"SiLU module ({dtype})", SiLU()(x), torch.nn.SiLU()(x), atol=atol, rtol=rtol)
    assert torch.isfinite(gx).all()


def _check_block_equals(what: str, block, reference, x) -> None:
    """`block(x)` equals `reference(x)` in fp64 within 1e-12: values, and the gradients of the input
    and of every weight."""
    results = []
    for fn in (block, reference):
        leaf = x.clone().requires_grad_()
        out = fn(leaf)
        results.append((out, torch.autograd.grad(out.square().sum(), [leaf, *block.parameters()])))
    (out, grads), (ref, ref_grads) = results
    check_close(f"{what} output", out, ref, atol=1e-12, rtol=1e-12)
    for name, g, r in zip(["input", *dict(block.named_parameters())], grads, ref_grads):
        check_close(f"{what} d/d {name}", g, r, atol=1e-12, rtol=1e-12)


def test_silu_saves_only_its_input():
    """Its backward recomputes sigmoid(x) from x instead of keeping it: F.silu's memory. (~0.01 s)"""
    def saved_by(fn):
        packed = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
            fn(torch.randn(8, 16, requires_grad=True) * 1.0)
        return packed

    assert saved_by(silu) == saved_by(F.silu) == [torch.Size([8, 16])]


@pytest.mark.parity
def test_model_swiglu_equals_the_written_out_silu():
    """camplib.model's SwiGLU (on torch's SiLU kernel) equals down(silu(gate x) * up x) with the
    written-out silu: the fast kernel changes speed, not the function. Values and gradients of the
    input and of every weight, fp64. (~0.01 s)"""
    torch.manual_seed(0)
    block = SwiGLU(GPTConfig.llama_style(d_model=16, d_ff=40)).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    _check_block_equals("SwiGLU", block, lambda t: block.down(silu(block.gate(t)) * block.up(t)), x)


def test_swiglu_is_silu_times_up():
    """swiglu(gate, up) = silu(gate) * up, values and both gradients, fp64. (~0.01 s)"""
    gen = torch.Generator().manual_seed(2)
    a, b = (torch.randn(3, 7, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(swiglu, (a, b))
    check_close("swiglu", swiglu(a, b), silu(a) * b, atol=1e-15, rtol=1e-14)


# against F.gelu(approximate="tanh") in the same dtype; measured on probe(): fp64 <= 2.4e-14,
# fp32 values <= 4.8e-7 and gradients <= 4.6e-6 (torch's own fp32 gradient is 1.6e-6 from fp64's),
# bf16 / fp16 one rounding of the same fp32 result (<= 1.6e-5 / 3.1e-5 apart)
GELU_TOL = {torch.float64: (1e-13, 1e-13), torch.float32: (1e-5, 1e-5),
            torch.bfloat16: (1e-2, 8e-3), torch.float16: (1e-3, 1e-3)}


@pytest.mark.parity
@pytest.mark.parametrize("dtype", sorted(GELU_TOL, key=str))
def test_gelu_tanh_matches_torch_values_and_gradients(dtype):
    """camplib.activations.gelu_tanh against torch.nn.functional.gelu(approximate="tanh"): values
    and gradients over the probe's range, tails included. (~0.01 s)"""
    x, grad_out = probe(dtype, torch.Generator().manual_seed(1))
    torch_gelu = lambda t: F.gelu(t, approximate="tanh")  # noqa: E731
    (y, gx), (y_ref, gx_ref) = values_and_grads(gelu_tanh, x, grad_out), values_and_grads(torch_gelu, x, grad_out)
    atol, rtol = GELU_TOL[dtype]
    assert y.dtype == dtype and gx.dtype == dtype
    check_close(f"gelu_tanh({dtype})", y, y_ref, atol=atol, rtol=rtol)
    check_close(f"d gelu_tanh / dx ({dtype})", gx, gx_ref, atol=atol, rtol=rtol)
    check_close(f"gelu(approximate='none') ({dtype})", gelu(x, "none"), F.gelu(x), atol=0, rtol=0)


def test_gelu_tanh_gradient_is_finite_where_the_cube_overflows():
    """Beyond |x| ~ 1.7e13 the cube overflows fp32; the gradient is still the limit, 1 on the right
    and 0 on the left (torch's own kernel gives NaN at +-1e30). (~0.01 s)"""
    x = torch.tensor([1e30, -1e30, 3e38, -3e38, 1e13, -1e13], requires_grad=True)
    y = gelu_tanh(x)
    y.backward(torch.ones_like(x))
    check_close("gelu_tanh at huge x", y, torch.where(x > 0, x, 0.0), atol=0, rtol=0)
    check_close("d gelu_tanh / dx at huge x", x.grad, (x > 0).float(), atol=0, rtol=0)
    with pytest.raises(ValueError, match="approximate"):
        gelu(x, "sigmoid")


@pytest.mark.parity
@pytest.mark.parametrize("approximate, capability", [("tanh", "AVX2"), ("tanh", "AVX512"), ("none", "AVX2")])
def test_model_mlp_equals_torch_gelu(approximate, capability, monkeypatch):
    """camplib.model's MLP (on camplib.activations.gelu) equals proj(F.gelu(fc x)): values and the
    gradients of the input and every weight, fp64, whichever tanh kernel the CPU's kernel level
    picks. (~0.01 s)"""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    torch.manual_seed(0)
    block = MLP(GPTConfig.gpt2_style(d_model=16, d_ff=40, gelu_approximate=approximate)).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64) * 3
    _check_block_equals("MLP", block, lambda t: block.proj(F.gelu(block.fc(t), approximate=approximate)), x)


@pytest.mark.parametrize("capability, kernel", [("AVX2", "_TanhGELUFunctionBackward"), ("AVX512", "GeluBackward0")])
def test_tanh_gelu_takes_the_faster_kernel_for_the_cpu(capability, kernel, monkeypatch):
    """On a CPU whose torch kernels are AVX2 the model's tanh GELU is the written-out Function (torch's
    tanh is slow there), on AVX512 torch's kernel: the same values either way."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    x = torch.randn(4, 8, requires_grad=True)
    y = gelu(x, "tanh")
    assert type(y.grad_fn).__name__ == kernel, f"{capability}: the GELU ran {type(y.grad_fn).__name__}, not {kernel}"
    check_close(f"gelu(tanh) on {capability}", y, F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-6)
