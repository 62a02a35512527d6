"""GPTQ (Frantar et al. 2022): quantize a layer's weight column by column, fixing the error as it goes.

Round-to-nearest (RTN) quantizes every weight on its own. What matters is the layer's *output* on
real inputs X (n, in): ||X W^T - X Q^T||^2 = sum over rows of (w - q) H (w - q)^T with
H = 2/n X^T X. GPTQ quantizes the input columns in order; after column i is rounded, the error
(w_i - q_i) / [H^-1]_ii is spread over the not-yet-quantized columns along row i of the
(upper Cholesky factor of the) inverse Hessian, so they compensate for it (Optimal Brain
Quantization, made fast: one Cholesky, updates batched in blocks of 128 columns).

Quantizer: zero-point, `bits` bits, one scale and zero per `group_size` input columns of each row,
taken from the *current* (already updated) weights when the group starts, as the reference code
does. Dampening adds 1% of the mean diagonal to H so that it stays invertible.
"""
from __future__ import annotations

import torch

from camplib.quant.formats import dequantize_zero_point, quantize_zero_point

__all__ = ["hessian", "gptq_quantize", "rtn_quantize", "output_error"]


def hessian(x: torch.Tensor) -> torch.Tensor:
    """H = 2/n X^T X from inputs (..., in), in fp64 for the factorisations."""
    x = x.reshape(-1, x.shape[-1]).double()
    return 2.0 / x.shape[0] * x.t() @ x


def _check(w: torch.Tensor, group_size: int) -> None:
    if w.dim() != 2 or not w.is_floating_point():
        raise ValueError(f"GPTQ quantizes a 2-D floating-point weight (out, in), got {w.dtype} of shape {tuple(w.shape)}")
    if w.shape[1] % group_size:
        raise ValueError(f"group_size {group_size} does not divide in_features {w.shape[1]} of the weight of shape "
                         f"{tuple(w.shape)}")


def rtn_quantize(w: torch.Tensor, bits: int = 4, group_size: int = 128) -> torch.Tensor:
    """Round-to-nearest with the same quantizer: the baseline GPTQ improves on."""
    _check(w, group_size)
    q, s, z = quantize_zero_point(w.float(), bits, group_size)
    return dequantize_zero_point(q, s, z, group_size).to(w.dtype)


def gptq_quantize(w: torch.Tensor, h: torch.Tensor, bits: int = 4, group_size: int = 128, damp: float = 0.01,
                  block: int = 128) -> torch.Tensor:
    """The dequantized GPTQ weight (same shape and dtype as w) for the Hessian h of its inputs."""
    _check(w, group_size)
    if h.shape != (w.shape[1], w.shape[1]):
        raise ValueError(f"the Hessian must be ({w.shape[1]}, {w.shape[1]}) for a weight of shape {tuple(w.shape)}, "
                         f"got {tuple(h.shape)}")
    W = w.double().clone()
    H = h.double().clone()
    dead = torch.diag(H) == 0                     # inputs that are always 0: any weight works, pick 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H += damp * torch.diag(H).mean() * torch.eye(H.shape[0], dtype=H.dtype)
    Hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    Q = torch.zeros_like(W)
    cols = W.shape[1]
    scale = zero = None
    for i1 in range(0, cols, block):
        i2 = min(i1 + block, cols)
        W1, Err1, Hinv1 = W[:, i1:i2].clone(), torch.zeros_like(W[:, i1:i2]), Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % group_size == 0:
                _, scale, zero = quantize_zero_point(W[:, col:col + group_size].float(), bits, "channel")
                scale, zero = scale.double(), zero.double()
            qmax = 2 ** bits - 1
            q = torch.clamp(torch.round(W1[:, i:i + 1] / scale) + zero, 0, qmax)
            q = (scale * (q - zero)).squeeze(1)
            Q[:, col] = q
            err = (W1[:, i] - q) / Hinv1[i, i]
            W1[:, i:] -= err.unsqueeze(1) @ Hinv1[i, i:].unsqueeze(0)
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return Q.to(w.dtype)


def output_error(w_hat: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> float:
    """Mean squared difference of the layer's outputs X W^T on inputs x."""
    x = x.reshape(-1, x.shape[-1]).double()
    return float((x @ (w_hat.double() - w.double()).t()).pow(2).mean())
