"""RMSNorm as one autograd Function with a hand-written backward that keeps only x and 1/rms:
what `camplib.model.RMSNorm` trains on.

Written out, RMSNorm is four or five small ops (cast, square, mean, rsqrt, multiply, cast,
scale); autograd keeps an intermediate for each of them, several of them the size of x. The
backward of y = w * x_hat, x_hat = x * r, r = 1/sqrt(mean(x^2) + eps), needs only x and r:

    dw = sum over rows of dy * x_hat
    dx = r * (g - x_hat * mean(g * x_hat)),   g = dy * w

so this Function saves x (already alive: the caller's input) and r (one number per row) and
recomputes x_hat. Same precision rules as camplib.model.RMSNorm: computed in at least fp32,
x_hat cast back to x's dtype before the weight; fp64 stays fp64. In fp32 it is also faster:
the mean of squares is one norm, and the products run in place (forward and backward of
(8, 128, 256) fp32 on one AVX2 core, at load ~10: 1.4 ms against 1.5-2.3 written out).

Where x, weight and dy share the working dtype (fp32, fp64) the backward needs not even x_hat:
with q = dy * x, dw = q^T r and mean(g x_hat) = r (q w) / d are two matrix-vector products
(one read of q each), so it takes six passes over x's size instead of eight (torch's vecdot is a
product and a sum on the CPU, and the column sum for dw reads q with a stride). Llama-style
training steps of benchmarks/train_throughput.py (1 thread, fp32, the old and new backward
alternating step by step, median CPU time, load ~9): the old step took 1.03-1.04x as long in
the small config, 1.01x in the medium one.
"""
from __future__ import annotations

import torch

__all__ = ["rms_norm", "FusedRMSNormFunction"]


class FusedRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        work = torch.promote_types(x.dtype, torch.float32)
        xf = x.to(work)
        # 1 / rms per row from one reduction pass (the norm) instead of two (square, mean)
        r = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(x.size(-1)).add_(eps).rsqrt_()
        ctx.save_for_backward(x, weight, r)
        if x.dtype == weight.dtype == work:         # fp32 / fp64: two passes, no cast
            return torch.mul(xf, r).mul_(weight)
        return weight * (xf * r).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight, r = ctx.saved_tensors
        work = r.dtype
        if x.dtype == weight.dtype == dy.dtype == work:            # fp32 / fp64: six passes
            return _backward_same_dtype(ctx, dy, x, weight, r)
        x_hat = x.to(work) * r                                     # recomputed, not stored
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy * x_hat.to(x.dtype)).reshape(-1, x.size(-1)).sum(0).to(weight.dtype)
        g = dy.to(work) * weight.to(work)
        mean = torch.linalg.vecdot(g, x_hat, dim=-1).unsqueeze(-1).div_(x.size(-1))
        dx = torch.addcmul(g, x_hat, mean, value=-1).mul_(r)      # r (g - x_hat mean(g x_hat))
        return dx.to(x.dtype), dw, None


def _backward_same_dtype(ctx, dy, x, weight, r):
    """The backward above without x_hat, where x, weight and dy share the working dtype. With
    q = dy * x (one pass) both sums over features and over rows are matrix-vector products
    (aten::mv, one read of q each; not counted among the benchmark's matrix products):
    dw = q^T r, and mean(g x_hat) = r (q w) / d per row, so dx = r (g - x c), c = r^2 (q w) / d.
    Six passes over x's size where the general path takes eight (x_hat, dy x_hat, its column sum,
    g, vecdot's product and sum, the multiply-add, the scaling)."""
    d = x.size(-1)
    q = (dy * x).reshape(-1, d)
    dw = torch.mv(q.T, r.reshape(-1)) if ctx.needs_input_grad[1] else None
    c = torch.mv(q, weight).reshape(r.shape).mul_(r).mul_(r).div_(d)     # r^2 (q w) / d, one per row
    dx = torch.addcmul(dy * weight, x, c, value=-1).mul_(r)
    return dx, dw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """weight * x / rms(x) over the last dimension; differentiable in x and weight."""
    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        raise TypeError(f"rms_norm: x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if weight.shape != (x.size(-1),):
        raise ValueError(f"rms_norm: weight must have shape ({x.size(-1)},) for x {tuple(x.shape)}, "
                         f"got {tuple(weight.shape)}")
    return FusedRMSNormFunction.apply(x, weight, float(eps))
