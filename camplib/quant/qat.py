"""Quantization-aware training: fake quantization with a straight-through gradient.

The forward quantizes and dequantizes at once, x̂ = s (clamp(round(x/s) + z, qmin, qmax) - z), so
the network trains with the rounding it will meet after quantization. Rounding's derivative is 0
almost everywhere; the straight-through estimator (Bengio et al. 2013) passes the gradient through
unchanged where the value landed on the grid and zeroes it where it was clipped. Gradients equal
`torch.fake_quantize_per_tensor_affine`'s (which also computes x * (1/s), so the forward agrees
bit for bit).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FakeQuantize", "fake_quantize", "QATLinear"]


class FakeQuantize(torch.autograd.Function):
    """fake_quantize as an autograd Function: the backward is the straight-through mask."""

    @staticmethod
    def forward(ctx, x, scale: float, zero_point: int, quant_min: int, quant_max: int):
        q = torch.round(x * (1.0 / scale)) + zero_point
        inside = (q >= quant_min) & (q <= quant_max)
        ctx.save_for_backward(inside)
        return (torch.clamp(q, quant_min, quant_max) - zero_point) * scale

    @staticmethod
    def backward(ctx, grad):
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None, None, None


def fake_quantize(x: torch.Tensor, scale: float, zero_point: int, quant_min: int, quant_max: int) -> torch.Tensor:
    if not x.is_floating_point():
        raise TypeError(f"fake_quantize needs a floating-point tensor, got {x.dtype} of shape {tuple(x.shape)}")
    if not scale > 0 or quant_min >= quant_max:
        raise ValueError(f"fake_quantize: need scale > 0 and quant_min < quant_max, got {scale}, [{quant_min}, {quant_max}]")
    return FakeQuantize.apply(x, float(scale), int(zero_point), int(quant_min), int(quant_max))


class QATLinear(nn.Linear):
    """An nn.Linear whose weight goes through symmetric fake quantization (absmax of the current
    weight, `bits` bits) in every forward: train it, then quantize it for real with
    camplib.quant.formats.quantize_absmax and the same bits; the trained model already expects
    the rounding."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, bits: int = 8, **kw):
        super().__init__(in_features, out_features, bias, **kw)
        if not 2 <= bits <= 8:
            raise ValueError(f"QATLinear: bits must be in 2..8, got {bits}")
        self.bits = bits

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 8) -> "QATLinear":
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, bits,
                    device=linear.weight.device, dtype=linear.weight.dtype)
        layer.load_state_dict(linear.state_dict())
        return layer

    def quantized_weight(self) -> torch.Tensor:
        qmax = 2 ** (self.bits - 1) - 1
        scale = float(self.weight.detach().abs().max()) / qmax or 1.0     # the scale itself gets no gradient
        return fake_quantize(self.weight, scale, 0, -qmax, qmax)

    def forward(self, x):
        return F.linear(x, self.quantized_weight(), self.bias)
