"""camplib.kernels.fused_swiglu against F.silu(a) * b and camplib.model.SwiGLU: outputs and
gradients in fp64 and fp32, and the tensor it does not save."""
import pytest
import torch
import torch.nn.functional as F

from camplib.kernels.fused_swiglu import swiglu
from camplib.memory import saved_activation_bytes
from camplib.model import GPTConfig, SwiGLU
from tests.support import assert_close

# fp64: measured <= 2e-16; fp32: the recomputed sigmoid rounds differently, measured <= 5e-7
TOL = {torch.float64: dict(atol=1e-12, rtol=1e-12), torch.float32: dict(atol=1e-5, rtol=1e-5)}


@pytest.mark.parity
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_equals_the_unfused_product_forward_and_backward(dtype):
    g = torch.Generator().manual_seed(1)
    a, b, dh = (torch.randn(4, 9, 96, generator=g, dtype=dtype) * 4 for _ in range(3))
    results = []
    for fn in (swiglu, lambda a, b: F.silu(a) * b):
        ai, bi = a.clone().requires_grad_(), b.clone().requires_grad_()
        h = fn(ai, bi)
        results.append([h, *torch.autograd.grad(h, (ai, bi), dh)])
    for name, m, r in zip(["h", "da", "db"], *results):
        assert_close(f"{name} ({dtype})", m, r, **TOL[dtype])


@pytest.mark.parity
def test_equals_camplib_swiglu_module_with_its_weights():
    cfg = GPTConfig.llama_style(d_model=32, d_ff=80)
    torch.manual_seed(0)
    mlp = SwiGLU(cfg).double()
    x = torch.randn(2, 5, 32, dtype=torch.float64, requires_grad=True)
    ref = mlp(x)
    mine = mlp.down(swiglu(mlp.gate(x), mlp.up(x)))
    assert_close("SwiGLU output", mine, ref, **TOL[torch.float64])
    params = [x, *mlp.parameters()]
    for p, gm, gr in zip(["x", *dict(mlp.named_parameters())], torch.autograd.grad(mine.sum(), params),
                         torch.autograd.grad(ref.sum(), params)):
        assert_close(f"grad {p}", gm, gr, **TOL[torch.float64])


def test_saves_its_inputs_only():
    a, b = (torch.randn(8, 256, requires_grad=True) for _ in range(2))
    fused_bytes, _ = saved_activation_bytes(swiglu, a, b)
    ref_bytes, _ = saved_activation_bytes(lambda a, b: F.silu(a) * b, a, b)
    assert fused_bytes == 0, f"fused SwiGLU saved {fused_bytes} bytes beyond its inputs"
    assert ref_bytes == a.numel() * 4, f"unfused: expected silu(a) saved ({a.numel() * 4} bytes), got {ref_bytes}"


@pytest.mark.parametrize("a, b, error, message", [
    (torch.randn(2, 3), torch.randn(2, 4), ValueError, "agree in shape"),
    (torch.randn(2, 3), torch.randn(2, 3, dtype=torch.float64), ValueError, "agree in shape and dtype"),
    (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.long), TypeError, "floating-point"),
])
def test_bad_input_is_a_clear_error(a, b, error, message):
    with pytest.raises(error, match=message):
        swiglu(a, b)
