"""Integer formats: absmax (symmetric) and zero-point (asymmetric) quantization, and int4 packing.

A b-bit integer grid has 2^b points; the scale s maps real numbers onto it. Absmax centres the
grid on 0 (q in [-(2^(b-1)-1), 2^(b-1)-1], x̂ = s q): exact zeros stay zero, one code is wasted.
Zero-point shifts it onto [min, max] (q in [0, 2^b - 1], x̂ = s (q - z)): no range is wasted
when the values are lopsided (after a ReLU, or a group whose values happen to be all positive).

*Granularity* is how many values share one scale: one per tensor (one outlier ruins everything),
one per output channel (a row of the weight), or one per group of `group_size` consecutive input
features in each row (int4 needs this: 16 levels cannot cover a whole row well). The scale of a
slice is computed from that slice alone, so finer groups track the values better and cost more
bytes of scales.

The order of operations is the formula's: divide by s, round to the nearest integer (ties to even,
as torch.round), add z, then clamp to the grid. Clamping *before* adding z would let codes leave
[0, 2^b - 1] whenever a calibrated scale clips values.
"""
from __future__ import annotations

import torch

__all__ = ["quantize_absmax", "dequantize_absmax", "quantize_zero_point", "dequantize_zero_point",
           "pack_int4", "unpack_int4", "grouped"]

def _check_float(x: torch.Tensor, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{what} must be a floating-point tensor (fp32/fp16/bf16/fp64), got {x.dtype} "
                        f"of shape {tuple(x.shape)}")


def grouped(x: torch.Tensor, granularity) -> torch.Tensor:
    """A view of `x` as (slices, values per slice) for one scale per slice: "tensor" -> (1, N),
    "channel" -> (rows, N / rows), an int g -> (rows * in / g, g) for a 2-D (rows, in) tensor."""
    if granularity == "tensor":
        return x.reshape(1, -1)
    if x.dim() < 2:
        raise ValueError(f"granularity {granularity!r} needs a (out_features, in_features) weight, got shape {tuple(x.shape)}")
    if granularity == "channel":
        return x.reshape(x.shape[0], -1)
    if isinstance(granularity, bool) or not isinstance(granularity, int) or granularity < 1:
        raise ValueError(f"granularity must be 'tensor', 'channel' or a positive group size, got {granularity!r}")
    if x.shape[-1] % granularity:
        raise ValueError(f"group_size {granularity} does not divide in_features {x.shape[-1]} "
                         f"of the weight of shape {tuple(x.shape)}")
    return x.reshape(-1, granularity)


def quantize_absmax(x: torch.Tensor, bits: int = 8, granularity="tensor", scale: torch.Tensor | None = None):
    """Symmetric quantization: returns (q, scale), q int8 (bits <= 8) in [-(2^(b-1)-1), 2^(b-1)-1]
    shaped like x, scale fp32 of shape (slices, 1). Pass `scale` to use a calibrated one (values
    beyond it are clipped)."""
    _check_float(x, "x")
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in 2..8, got {bits}")
    qmax = 2 ** (bits - 1) - 1
    g = grouped(x, granularity).float()
    if scale is None:
        amax = g.abs().amax(dim=1, keepdim=True)
        scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))   # an all-zero slice: any scale works
    q = torch.clamp(torch.round(g / scale), -qmax, qmax)
    return q.to(torch.int8).reshape(x.shape), scale


def dequantize_absmax(q: torch.Tensor, scale: torch.Tensor, granularity="tensor", dtype=torch.float32) -> torch.Tensor:
    """x̂ = scale * q, in `dtype`."""
    return (grouped(q, granularity).float() * scale).reshape(q.shape).to(dtype)


def quantize_zero_point(x: torch.Tensor, bits: int = 8, granularity="tensor",
                        scale: torch.Tensor | None = None, zero: torch.Tensor | None = None):
    """Asymmetric quantization: returns (q, scale, zero), q uint8 in [0, 2^b - 1] shaped like x,
    scale fp32 and zero (an integer code, fp32) of shape (slices, 1). The range always includes 0
    so that exact zeros stay exact."""
    _check_float(x, "x")
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in 2..8, got {bits}")
    qmax = 2 ** bits - 1
    g = grouped(x, granularity).float()
    if scale is None:
        lo = g.amin(dim=1, keepdim=True).clamp(max=0)
        hi = g.amax(dim=1, keepdim=True).clamp(min=0)
        scale = torch.where(hi > lo, (hi - lo) / qmax, torch.ones_like(hi))
        zero = torch.round(-lo / scale)
    elif zero is None:
        raise ValueError("quantize_zero_point: pass zero together with scale")
    q = torch.clamp(torch.round(g / scale) + zero, 0, qmax)
    return q.to(torch.uint8).reshape(x.shape), scale, zero


def dequantize_zero_point(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, granularity="tensor",
                          dtype=torch.float32) -> torch.Tensor:
    """x̂ = scale * (q - zero), in `dtype`."""
    return (scale * (grouped(q, granularity).float() - zero)).reshape(q.shape).to(dtype)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes (integers in [0, 15]) per byte along the last dimension: element 2i goes
    to the high nibble, 2i + 1 to the low one (bitsandbytes' order). (..., n) -> uint8 (..., n/2)."""
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError(f"pack_int4 packs integer codes, got {codes.dtype} of shape {tuple(codes.shape)}")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"pack_int4 needs an even last dimension (two codes per byte), got shape {tuple(codes.shape)}")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 15):
        raise ValueError(f"pack_int4: codes must lie in [0, 15], got [{int(codes.min())}, {int(codes.max())}] "
                         f"in a tensor of shape {tuple(codes.shape)}")
    c = codes.to(torch.uint8)
    return (c[..., 0::2] << 4) | c[..., 1::2]


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4: uint8 (..., n/2) -> uint8 codes (..., n)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_int4 reads uint8 bytes, got {packed.dtype} of shape {tuple(packed.shape)}")
    out = torch.stack([packed >> 4, packed & 0xF], dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)
