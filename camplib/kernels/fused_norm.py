"""RMSNorm as one autograd Function with a hand-written backward that keeps only x and 1/rms.

`camplib.model.RMSNorm` is four or five small ops (cast, square, mean, rsqrt, multiply, cast,
scale); autograd keeps an intermediate for each of them, several of them the size of x. The
backward of y = w * x_hat, x_hat = x * r, r = 1/sqrt(mean(x^2) + eps), needs only x and r:

    dw = sum over rows of dy * x_hat
    dx = r * (g - x_hat * mean(g * x_hat)),   g = dy * w

so this Function saves x (already alive: the caller's input) and r (one number per row) and
recomputes x_hat. Same precision rules as camplib.model.RMSNorm: computed in at least fp32,
x_hat cast back to x's dtype before the weight; fp64 stays fp64.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["rms_norm", "FusedRMSNormFunction", "FusedRMSNorm"]


class FusedRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        work = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(work)
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)   # (..., 1): the only new thing saved
        ctx.save_for_backward(x, weight, r)
        return weight * (xf * r).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, r = ctx.saved_tensors
        work = r.dtype
        x_hat = x.to(work) * r                                     # recomputed, not stored
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy * x_hat.to(x.dtype)).reshape(-1, x.size(-1)).sum(0).to(weight.dtype)
        g = dy.to(work) * weight.to(work)
        dx = r * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
        return dx.to(x.dtype), dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """weight * x / rms(x) over the last dimension; differentiable in x and weight."""
    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        raise TypeError(f"rms_norm: x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if weight.shape != (x.size(-1),):
        raise ValueError(f"rms_norm: weight must have shape ({x.size(-1)},) for x {tuple(x.shape)}, "
                         f"got {tuple(weight.shape)}")
    return FusedRMSNormFunction.apply(x, weight, float(eps))


class FusedRMSNorm(nn.Module):
    """Drop-in for camplib.model.RMSNorm (same `weight` parameter and state-dict key)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)
