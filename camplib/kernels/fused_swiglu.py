"""SwiGLU's gate, silu(a) * b, as one autograd Function that saves only its two inputs.

Eagerly, `F.silu(a) * b` keeps a (for silu's backward) and silu(a) and b (for the product's):
three tensors of the MLP's width d_ff, the widest activation of a transformer block. With
s = sigmoid(a), the derivatives

    d/da [a s b] = b * s * (1 + a (1 - s)),    d/db [a s b] = a s

need only a and b: the Function recomputes s in backward, saving one d_ff-wide tensor per
layer for one extra sigmoid. Computed in the inputs' dtype (what F.silu does).
"""
from __future__ import annotations

import torch

__all__ = ["swiglu", "FusedSwiGLUFunction"]


class FusedSwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.nn.functional.silu(a) * b

    @staticmethod
    def backward(ctx, dh):
        a, b = ctx.saved_tensors
        # da = (dh * b) * s * (1 + a (1 - s)): torch's own silu_backward kernel computes exactly
        # that in one pass (the formula spelled out costs ~7 element-wise passes on the CPU)
        da = torch.ops.aten.silu_backward(dh * b, a) if ctx.needs_input_grad[0] else None
        db = dh * torch.nn.functional.silu(a) if ctx.needs_input_grad[1] else None   # silu(a) recomputed
        return da, db


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b for a = gate(x), b = up(x) of the same shape and dtype."""
    for name, t in (("a", a), ("b", b)):
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            raise TypeError(f"swiglu: {name} must be a floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"swiglu: a and b must agree in shape and dtype, got {a.dtype} {tuple(a.shape)} "
                         f"and {b.dtype} {tuple(b.shape)}")
    return FusedSwiGLUFunction.apply(a, b)
