"""Weight-only quantized Linear layers: store int8 / int4 / NF4, dequantize on the fly.

For LLM inference at small batch the time goes into *reading weights* from memory, not into
arithmetic; storing them in 8 or 4 bits reads 4-8x fewer bytes. The activations stay in floating
point: each forward dequantizes the weight to the input's dtype and runs an ordinary matmul (a
real kernel fuses the two; here the point is the storage and the error, not the speed).

Schemes (weight (out, in)):
- "int8": absmax per output channel, one fp32 scale per row;
- "int4": zero-point per group of `group_size` input features, codes packed two per byte,
  fp32 scale and zero per group;
- "nf4": NF4 in blocks of `group_size` (64 by default), optionally double-quantized.
The bias (if any) stays in the original dtype. `weight_bytes()` counts what is really stored.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from camplib.memory import storage_bytes
from camplib.quant.formats import (dequantize_absmax, dequantize_zero_point, grouped, pack_int4,
                                   quantize_absmax, quantize_zero_point, unpack_int4)
from camplib.quant.nf4 import NF4Weight, dequantize_nf4, quantize_nf4

__all__ = ["QuantLinear", "quantize_model", "SCHEMES"]

SCHEMES = ("int8", "int4", "nf4")


class QuantLinear(nn.Module):
    """A frozen quantized copy of an nn.Linear; `forward` = F.linear(x, dequantized W, bias)."""

    def __init__(self, linear: nn.Linear, scheme: str = "int8", group_size: int | None = None,
                 double_quant: bool = False):
        super().__init__()
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"QuantLinear wraps an nn.Linear, got {type(linear).__name__}")
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        w = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.scheme, self.dtype = scheme, w.dtype
        self.group_size = group_size or {"int8": None, "int4": 128, "nf4": 64}[scheme]
        if scheme == "int8":
            q, scale = quantize_absmax(w, 8, "channel")
            self.register_buffer("qweight", q)
            self.register_buffer("scale", scale)
        elif scheme == "int4":
            grouped(w, self.group_size)                       # the clear error for a group size that does not divide in
            if self.in_features % 2:
                raise ValueError(f"int4 packing needs an even in_features, got weight of shape {tuple(w.shape)}")
            q, scale, zero = quantize_zero_point(w, 4, self.group_size)
            self.register_buffer("qweight", pack_int4(q))
            self.register_buffer("scale", scale)
            self.register_buffer("zero", zero.to(torch.uint8))  # codes 0..15: one byte each
        else:
            self.nf4 = quantize_nf4(w, self.group_size, double_quant)
            for name, t in (("qweight", self.nf4.packed), ("absmax", self.nf4.absmax),
                            ("absmax_scale", self.nf4.absmax_scale), ("absmax_offset", self.nf4.absmax_offset)):
                self.register_buffer(name, t)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = dtype or self.dtype
        if self.scheme == "int8":
            return dequantize_absmax(self.qweight, self.scale, "channel", dtype)
        if self.scheme == "int4":
            return dequantize_zero_point(unpack_int4(self.qweight), self.scale, self.zero.float(), self.group_size, dtype)
        w = NF4Weight(self.qweight, self.absmax, (self.out_features, self.in_features), self.dtype, self.group_size,
                      self.absmax_scale, self.absmax_offset)
        return dequantize_nf4(w, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def weight_bytes(self) -> int:
        """Bytes stored for the weight: codes plus scales (and zeros / nested absmax), not the bias."""
        return storage_bytes(t for name, t in self.named_buffers() if name != "bias")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme}, "
                f"group_size={self.group_size}")


def quantize_model(model: nn.Module, scheme: str = "int8", group_size: int | None = None,
                   skip: tuple[str, ...] = ("lm_head",), double_quant: bool = False) -> list[str]:
    """Replace every nn.Linear of `model` (except names ending in one of `skip`) by a QuantLinear,
    in place; returns the replaced names. Checks every layer first, so an error changes nothing."""
    names = [n for n, m in model.named_modules()
             if isinstance(m, nn.Linear) and not any(n == s or n.endswith("." + s) for s in skip)]
    if not names:
        raise ValueError(f"quantize_model: {type(model).__name__} has no nn.Linear to quantize (skip={skip})")
    layers = {n: QuantLinear(model.get_submodule(n), scheme, group_size, double_quant) for n in names}
    for n, layer in layers.items():
        parent, _, child = n.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, layer)
    return names
