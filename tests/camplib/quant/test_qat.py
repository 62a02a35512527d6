"""camplib.quant.qat: fake quantization's output and gradient against
torch.fake_quantize_per_tensor_affine (bit for bit), and QATLinear against its definition."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from camplib.quant.formats import dequantize_absmax, quantize_absmax
from camplib.quant.qat import QATLinear, fake_quantize
from tests.support import assert_close

pytestmark = pytest.mark.parity


@pytest.mark.parametrize("scale,zp,qmin,qmax", [(0.02, 0, -128, 127), (0.05, 100, 0, 255), (0.3, 8, 0, 15), (0.7, 0, -2, 1)])
def test_output_and_gradient_equal_torch_fake_quantize(scale, zp, qmin, qmax):
    g = torch.Generator().manual_seed(qmax)
    x = torch.randn(6, 33, generator=g) * scale * (qmax - qmin) / 3
    grad = torch.randn(6, 33, generator=g)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = fake_quantize(a, scale, zp, qmin, qmax), torch.fake_quantize_per_tensor_affine(b, scale, zp, qmin, qmax)
    out.backward(grad)
    ref.backward(grad)
    assert_close("fake-quantized output", out, ref, atol=0, rtol=0)
    assert_close("straight-through gradient (zero where clipped)", a.grad, b.grad, atol=0, rtol=0)
    assert 0 < int((a.grad == 0).sum()) < a.numel(), "the cases should clip some values and pass others"


def test_qat_linear_forward_is_the_fake_quantized_weight_and_trains():
    torch.manual_seed(0)
    base = nn.Linear(16, 8)
    layer = QATLinear.from_linear(base, bits=4)
    x = torch.randn(5, 16)
    q, s = quantize_absmax(base.weight.detach(), 4, "tensor")
    assert_close("QATLinear forward = linear with the 4-bit weight", layer(x),
                 F.linear(x, dequantize_absmax(q, s), base.bias), atol=1e-6, rtol=1e-6)
    layer(x).pow(2).sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_bad_input():
    with pytest.raises(TypeError, match=r"torch.int64 of shape \(3,\)"):
        fake_quantize(torch.arange(3), 0.1, 0, -8, 7)
    with pytest.raises(ValueError, match="scale > 0"):
        fake_quantize(torch.randn(3), 0.0, 0, -8, 7)
