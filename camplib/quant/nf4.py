"""NF4, the 4-bit NormalFloat of QLoRA (Dettmers et al. 2023), with double quantization.

Trained weights are roughly normal. NF4's 16 code values are quantiles of N(0, 1) scaled into
[-1, 1] (8 on the positive side, 7 on the negative, and an exact 0), so each code is used about
equally often: more levels near 0, where most weights are. A weight is cut into blocks of 64
consecutive values (in row-major order, across rows); each block is divided by its absmax and
every value becomes the index of the nearest code value; two indices per byte.

Double quantization: one fp32 absmax per 64 weights costs 0.5 bits per weight. QLoRA quantizes
those absmax values again, in blocks of 256, to 8 bits with bitsandbytes' *dynamic* map (a signed
8-bit float-like code book, `dynamic_map`), after subtracting their mean: 8/64 + 32/(64*256) =
0.127 bits per weight.

Everything here follows `bitsandbytes.functional.quantize_4bit` (0.50.2) operation by operation
(multiply by 1/absmax, nearest code by the midpoints between codes, high nibble first), so the
4-bit codes and the block absmax are identical bit for bit, with and without double
quantization. The 8-bit codes of double quantization are the nearest ones, bit for bit those of
bitsandbytes' reference kernel; its compiled CPU kernel misplaces a few (see quantize_blockwise).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from camplib.quant.formats import pack_int4, unpack_int4

__all__ = ["NF4_CODE", "NF4Weight", "quantize_nf4", "dequantize_nf4", "dynamic_map", "quantize_blockwise",
           "dequantize_blockwise", "nearest_code"]

# The published table (QLoRA, appendix; bitsandbytes' get_4bit_type("nf4")), sorted.
NF4_CODE = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0], dtype=torch.float32)


def dynamic_map(signed: bool = True, max_exponent_bits: int = 7, total_bits: int = 8) -> torch.Tensor:
    """bitsandbytes' dynamic 8-bit code book (Dettmers 2015): per decade 10^-6 .. 10^0 a linear
    fraction grid whose resolution grows with the magnitude, plus 0 and 1; 256 values, sorted."""
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        n = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        edges = torch.linspace(0.1, 1, n, dtype=torch.float32)
        means = (edges[:-1] + edges[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    if additional_items > 0:
        edges = torch.linspace(0.1, 1, additional_items + 1, dtype=torch.float32)
        means = (edges[:-1] + edges[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data += [0, 1.0]
    data += [0] * (2 ** total_bits - len(data))
    return torch.tensor(sorted(data), dtype=torch.float32)


def nearest_code(scaled: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Index of the nearest value of the sorted `code` for each element (a tie goes up)."""
    bounds = (code[:-1] + code[1:]) / 2
    return torch.bucketize(scaled, bounds.to(scaled.device), out_int32=True)


def _blocks(flat: torch.Tensor, blocksize: int):
    """absmax per block of `blocksize` (the last block may be shorter) and the values / absmax,
    clamped to [-1, 1], computed as bitsandbytes does (times 1/absmax; the short tail divided)."""
    n = flat.numel()
    full = n - n % blocksize
    body = flat[:full].reshape(-1, blocksize)
    absmax = body.abs().max(dim=-1)[0]
    scaled = torch.clamp(body * (1.0 / absmax.clamp(min=1e-38).view(-1, 1)), -1, 1).reshape(-1)
    if full < n:
        am = flat[full:].abs().max().clamp(min=1e-38)
        absmax = torch.cat([absmax, am.unsqueeze(0)])
        scaled = torch.cat([scaled, torch.clamp(flat[full:] / am, -1, 1)])
    return absmax, scaled


def _expand(absmax: torch.Tensor, n: int, blocksize: int) -> torch.Tensor:
    return absmax.repeat_interleave(blocksize)[:n]


def quantize_blockwise(x: torch.Tensor, code: torch.Tensor, blocksize: int):
    """8-bit blockwise quantization onto a code book: (uint8 indices, fp32 absmax per block), as
    bitsandbytes' reference (pure PyTorch) kernel. Its compiled CPU kernel, which
    `quantize_4bit(compress_statistics=True)` calls on a CPU, puts about 0.2% of values one or
    more codes away from the nearest one; the tests show both."""
    absmax, scaled = _blocks(x.reshape(-1).float(), blocksize)
    return nearest_code(scaled, code).to(torch.uint8), absmax


def dequantize_blockwise(q: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor, blocksize: int) -> torch.Tensor:
    return code.to(q.device)[q.long()] * _expand(absmax, q.numel(), blocksize)


@dataclass
class NF4Weight:
    """A tensor in NF4: `packed` uint8 (two codes per byte), one absmax per block, either fp32
    (`absmax`) or double-quantized (`absmax` uint8 codes of `dynamic_map`, `absmax_scale` fp32 per
    256 of them, `absmax_offset` their subtracted mean)."""
    packed: torch.Tensor
    absmax: torch.Tensor
    shape: tuple
    dtype: torch.dtype
    blocksize: int = 64
    absmax_scale: torch.Tensor | None = None
    absmax_offset: torch.Tensor | None = None
    absmax_blocksize: int = 256

    @property
    def double_quant(self) -> bool:
        return self.absmax_scale is not None

    def tensors(self) -> list[torch.Tensor]:
        """What is stored (for storage_bytes)."""
        return [t for t in (self.packed, self.absmax, self.absmax_scale, self.absmax_offset) if t is not None]

    def block_absmax(self) -> torch.Tensor:
        """The fp32 absmax of each block (decoded first when double-quantized)."""
        if not self.double_quant:
            return self.absmax
        code = dynamic_map().to(self.absmax.device)
        return dequantize_blockwise(self.absmax, self.absmax_scale, code, self.absmax_blocksize) + self.absmax_offset


def quantize_nf4(x: torch.Tensor, blocksize: int = 64, double_quant: bool = False) -> NF4Weight:
    """NF4 in blocks of `blocksize` consecutive values; `double_quant` also quantizes the absmax."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"quantize_nf4 needs a floating-point tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)} of shape {tuple(getattr(x, 'shape', ()))}")
    if not isinstance(blocksize, int) or blocksize < 2 or blocksize % 2:
        raise ValueError(f"quantize_nf4: blocksize must be an even integer >= 2, got {blocksize!r}")
    if x.numel() == 0:
        raise ValueError(f"quantize_nf4: empty tensor of shape {tuple(x.shape)}")
    absmax, scaled = _blocks(x.reshape(-1).float(), blocksize)
    codes = nearest_code(scaled, NF4_CODE.to(x.device))
    if codes.numel() % 2:
        codes = torch.nn.functional.pad(codes, (0, 1), value=7)   # the last low nibble: padding, coded as 0.0
    w = NF4Weight(pack_int4(codes), absmax, tuple(x.shape), x.dtype, blocksize)
    if double_quant:
        offset = absmax.mean()
        w.absmax, w.absmax_scale = quantize_blockwise(absmax - offset, dynamic_map().to(x.device), w.absmax_blocksize)
        w.absmax_offset = offset
    return w


def dequantize_nf4(w: NF4Weight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """code[index] * absmax of its block, reshaped and cast back (to `dtype`, default the original)."""
    n = 1
    for s in w.shape:
        n *= s
    values = NF4_CODE.to(w.packed.device)[unpack_int4(w.packed).reshape(-1)[:n].long()]
    out = values * _expand(w.block_absmax(), n, w.blocksize)
    return out.reshape(w.shape).to(dtype or w.dtype)
