"""LLM.int8() (Dettmers et al. 2022): int8 matmul with the outlier features kept in floating point.

In large transformers a few input features of the linear layers carry huge activations (|x| of
6 and far more, in nearly every token). Quantizing a token row to int8 with one absmax scale then
crushes all its other features to a few levels. LLM.int8() splits X W^T by input feature:

- outlier columns (any |x| >= threshold, 6.0 by default) stay in floating point and multiply
  the matching weight columns (dequantized from int8: the weight is stored once, in int8);
- everything else is quantized vector-wise, absmax per row of X and per row of W
  (per output feature), multiplied in integers (int32 accumulation) and rescaled by both scales.

This follows bitsandbytes' reference kernels (int8_vectorwise_quant, int8_mixed_scaled_mm) step
by step, so the codes are equal and the outputs agree to rounding; on a CPU bitsandbytes'
Linear8bitLt itself skips the decomposition (it dequantizes the int8 weight and runs one float
matmul), which the tests show as well.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["vectorwise_int8", "llm_int8_matmul", "Int8OutlierLinear"]


def vectorwise_int8(a: torch.Tensor, threshold: float = 0.0):
    """Per-row absmax int8 of a 2-D tensor: (codes int8, row absmax fp32, outlier columns or None).
    With threshold > 0, elements with |a| >= threshold are left out of the row absmax and their
    whole columns get code 0 (they go through the floating-point path instead)."""
    if a.dim() != 2 or not a.is_floating_point():
        raise ValueError(f"vectorwise_int8 needs a 2-D floating-point tensor, got {a.dtype} of shape {tuple(a.shape)}")
    cols = None
    if threshold > 0:
        outliers = a.abs() >= threshold
        cols = torch.argwhere(outliers.any(dim=0)).view(-1)
        a = a.masked_fill(outliers, 0)
    absmax = a.abs().max(dim=1).values.float()
    codes = torch.round(a * (127.0 / absmax.unsqueeze(-1))).to(torch.int8)
    if cols is not None and a.shape[0] > 1:
        codes[:, cols] = 0
    return codes, absmax, cols


def llm_int8_matmul(x: torch.Tensor, weight_codes: torch.Tensor, weight_absmax: torch.Tensor,
                    threshold: float = 6.0, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (..., in) @ W^T with W given as int8 codes (out, in) and per-row absmax (out,)."""
    lead, d_in = x.shape[:-1], x.shape[-1]
    if weight_codes.shape[1] != d_in:
        raise ValueError(f"llm_int8_matmul: x has {d_in} input features, the weight is {tuple(weight_codes.shape)}")
    a = x.reshape(-1, d_in)
    codes, absmax, cols = vectorwise_int8(a, threshold)
    acc = codes.float() @ weight_codes.float().t()           # exact integers (|sum| < 2^24 for in <= 1040)
    out = acc * (absmax.unsqueeze(-1) * weight_absmax.unsqueeze(0)) * (1.0 / (127 * 127))
    if bias is not None:
        out = out + bias
    out = out.to(x.dtype)
    if cols is not None and cols.numel():
        w_cols = (weight_codes[:, cols].float() * (weight_absmax.unsqueeze(1) / 127.0)).to(x.dtype)
        out = out.addmm(a[:, cols], w_cols.t())
    return out.reshape(*lead, -1)


class Int8OutlierLinear(nn.Module):
    """An nn.Linear stored as int8 (vector-wise) whose forward is llm_int8_matmul."""

    def __init__(self, linear: nn.Linear, threshold: float = 6.0):
        super().__init__()
        codes, absmax, _ = vectorwise_int8(linear.weight.detach())
        self.register_buffer("weight_codes", codes)
        self.register_buffer("weight_absmax", absmax)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.threshold = threshold

    def forward(self, x):
        return llm_int8_matmul(x, self.weight_codes, self.weight_absmax, self.threshold, self.bias)
