"""llama.cpp's block formats (the weights inside a .gguf file): Q8_0, Q4_0 and Q4_1.

Each is a04..a07's group quantization with groups of 32 along a row and the scales stored in
fp16 next to the codes, block after block:

| type | bytes / 32 weights | block layout                          | weight                |
|------|--------------------|---------------------------------------|-----------------------|
| Q8_0 | 34 (8.5 bits)      | fp16 d, 32 x int8 q                   | d * q                 |
| Q4_0 | 18 (4.5 bits)      | fp16 d, 16 bytes of 4-bit q           | d * (q - 8)           |
| Q4_1 | 20 (5 bits)        | fp16 d, fp16 m, 16 bytes of 4-bit q   | d * q + m             |

Q8_0 and Q4_0 are absmax (symmetric) codes, Q4_1 a zero-point (min/max) code. The 4-bit layout
differs from camplib.quant.pack_int4's: byte j holds weight j in its low nibble and weight j + 16
in its high nibble. Rounding follows llama.cpp's reference quantizers (ggml-quants.c), so both
directions equal the `gguf` package's numpy implementation bit for bit (tests/camplib/quant).
"""
from __future__ import annotations

import torch

__all__ = ["BLOCK", "BLOCK_BYTES", "quantize_blocks", "dequantize_blocks"]

BLOCK = 32
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}


def _fp16_bytes(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).reshape(-1, 1).view(torch.uint8)


def _round_away(x: torch.Tensor) -> torch.Tensor:
    """C's roundf: halves away from zero (torch.round rounds them to even)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """(n, 32) codes in 0..15 -> (n, 16) bytes: weight j low, weight j + 16 high."""
    return (q[:, :16] | (q[:, 16:] << 4)).to(torch.uint8)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    return torch.where(d == 0, torch.zeros_like(d), 1 / d)


def quantize_blocks(x: torch.Tensor, kind: str) -> torch.Tensor:
    """x (..., k) with k a multiple of 32 -> uint8 (..., k // 32 * BLOCK_BYTES[kind])."""
    if kind not in BLOCK_BYTES:
        raise ValueError(f"kind must be one of {sorted(BLOCK_BYTES)}, got {kind!r}")
    if x.shape[-1] % BLOCK:
        raise ValueError(f"the last dimension ({x.shape[-1]}) is not a multiple of {BLOCK}")
    b = x.detach().to(torch.float32).reshape(-1, BLOCK)
    if kind == "Q8_0":
        d = b.abs().amax(1, keepdim=True) / 127
        q = _round_away(b * _inverse(d)).to(torch.int8).view(torch.uint8)
        out = torch.cat([_fp16_bytes(d), q], 1)
    elif kind == "Q4_0":
        extreme = b.gather(1, b.abs().argmax(1, keepdim=True))   # signed value of largest magnitude
        d = extreme / -8
        q = torch.trunc(b * _inverse(d) + 8.5).clamp(max=15).to(torch.int32)
        out = torch.cat([_fp16_bytes(d), _nibbles(q)], 1)
    else:  # Q4_1
        lo, hi = b.amin(1, keepdim=True), b.amax(1, keepdim=True)
        d = (hi - lo) / 15
        q = torch.trunc((b - lo) * _inverse(d) + 0.5).clamp(0, 15).to(torch.int32)
        out = torch.cat([_fp16_bytes(d), _fp16_bytes(lo), _nibbles(q)], 1)
    return out.reshape(*x.shape[:-1], -1)


def dequantize_blocks(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """uint8 (..., n_blocks * BLOCK_BYTES[kind]) -> float32 (..., n_blocks * 32)."""
    if kind not in BLOCK_BYTES:
        raise ValueError(f"kind must be one of {sorted(BLOCK_BYTES)}, got {kind!r}")
    size = BLOCK_BYTES[kind]
    if raw.dtype != torch.uint8 or raw.shape[-1] % size:
        raise ValueError(f"{kind} data must be uint8 in whole blocks of {size} bytes, got {raw.dtype} "
                         f"with last dimension {raw.shape[-1]}")
    b = raw.reshape(-1, size)
    d = b[:, :2].contiguous().view(torch.float16).to(torch.float32)
    if kind == "Q8_0":
        w = d * b[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    else:
        qs = b[:, 4 if kind == "Q4_1" else 2:]
        q = torch.cat([qs & 0xF, qs >> 4], 1).to(torch.float32)
        if kind == "Q4_0":
            w = d * (q - 8)
        else:
            w = d * q + b[:, 2:4].contiguous().view(torch.float16).to(torch.float32)
    return w.reshape(*raw.shape[:-1], -1)
