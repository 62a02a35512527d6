"""The FlashAttention-2 forward as one Triton kernel: the loops of camplib.kernels.flash, written
for the hardware. One program (a GPU thread block) owns one tile of `block_q` queries of one
(batch, head); it streams the key/value tiles through on-chip memory, keeps the running max, sum
and output in registers, and writes O and the log-sum-exp once. The N x N scores never reach HBM.

Autograd goes through `camplib.kernels.flash.FlashAttention` with this kernel as its forward, so
backward is `flash_backward` (PyTorch tiles, recomputing P from the lse this kernel saved): the
same numbers, without the speed of a fused backward kernel.

Where it runs:
- with CUDA, compiled (q, k, v on the GPU; fp16, bf16, fp32 with IEEE fp32 dot products, not TF32);
- without a GPU, in Triton's interpreter (TRITON_INTERPRET=1, set by this module before triton is
  imported when no GPU is present): slow, small shapes only, CPU tensors, fp32. Fixed block sizes
  (`@triton.autotune` needs a GPU). Triton's `tl.make_block_ptr` is gone in 3.9: plain pointers here.
Triton is installed on Linux only (pyproject's marker); elsewhere `triton_available()` is False
and calling the kernel raises a RuntimeError that says so.
"""
from __future__ import annotations

import math
import os
import sys

import torch

from camplib.kernels.flash import FlashAttention, check_inputs

# Triton reads TRITON_INTERPRET when it is first imported (its own tl.* helpers are decorated
# then) and at each @triton.jit below. torch._dynamo (torch.compile), peft and bitsandbytes import
# triton too: if one of them came first on a machine without CUDA, Triton is compiling, and the
# kernel would fail deep inside with "Cannot call @triton.jit'd outside of the scope of a kernel".
_MODE_ERROR = None
if not torch.cuda.is_available():
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        _MODE_ERROR = ("triton was imported before camplib.kernels.triton_flash (torch.compile, torch._dynamo, "
                       "peft and bitsandbytes import it) without TRITON_INTERPRET=1, so it cannot interpret "
                       "kernels on this machine without CUDA: restart the kernel and import "
                       "camplib.kernels.triton_flash first, or set TRITON_INTERPRET=1 before anything imports triton")
    os.environ.setdefault("TRITON_INTERPRET", "1")   # read when @triton.jit decorates below
try:
    import triton
    import triton.language as tl
except ImportError as exc:  # not on Linux, or not installed
    triton, tl, _IMPORT_ERROR = None, None, exc
else:
    _IMPORT_ERROR = None

__all__ = ["triton_available", "triton_flash_attention", "triton_flash_forward"]

GPU_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def triton_available() -> bool:
    return triton is not None


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if triton is not None:
    @triton.jit
    def _flash_forward_kernel(Q, K, V, O, LSE, KPM,
                              sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                              sob, soh, son, sod, slb, slh, smb,
                              H, GROUP, L, S, E, scale, shift,
                              HAS_KPM: tl.constexpr, IS_CAUSAL: tl.constexpr,
                              BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
        pid_q = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        hk = h // GROUP                                   # GQA: the kv head this query head reads
        rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
        dims = tl.arange(0, BLOCK_D)
        q_mask = (rows[:, None] < L) & (dims[None, :] < E)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dims[None, :] * sqd, mask=q_mask, other=0.0)
        m = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_Q,), tl.float32)
        acc = tl.zeros((BLOCK_Q, BLOCK_D), tl.float32)
        end = S
        if IS_CAUSAL:                                     # key tiles right of this tile's last row: all masked
            end = tl.minimum(S, tl.maximum(0, (pid_q + 1) * BLOCK_Q + shift))
        for start in range(0, end, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            kt = tl.load(K + b * skb + hk * skh + cols[None, :] * skn + dims[:, None] * skd,
                         mask=(cols[None, :] < S) & (dims[:, None] < E), other=0.0)      # (BLOCK_D, BLOCK_K)
            s = tl.dot(q, kt, input_precision="ieee") * scale
            valid = (cols[None, :] < S) & (rows[:, None] >= 0)
            if IS_CAUSAL:
                valid = valid & (cols[None, :] <= rows[:, None] + shift)   # absolute positions
            if HAS_KPM:
                keep = tl.load(KPM + b * smb + cols, mask=cols < S, other=0)
                valid = valid & (keep[None, :] != 0)
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m - m_safe)                    # rescale what was summed under the old max
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + dims[None, :] * svd,
                        mask=(cols[:, None] < S) & (dims[None, :] < E), other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m = m_new
        seen = l > 0
        out = acc / tl.where(seen, l, 1.0)[:, None]
        lse = tl.where(seen, m + tl.log(tl.where(seen, l, 1.0)), float("-inf"))
        tl.store(O + b * sob + h * soh + rows[:, None] * son + dims[None, :] * sod, out.to(O.dtype.element_ty),
                 mask=q_mask)
        tl.store(LSE + b * slb + h * slh + rows, lse, mask=rows < L)


def triton_flash_forward(q, k, v, *, scale, is_causal, key_padding_mask, block_q, block_k):
    """(O, lse) like camplib.kernels.flash.flash_forward, computed by the Triton kernel.
    lse is fp32 (B, H, L)."""
    if triton is None:
        raise RuntimeError(f"triton_flash_attention needs Triton (installed on Linux only): {_IMPORT_ERROR}")
    if _MODE_ERROR:
        raise RuntimeError(_MODE_ERROR)
    on_gpu = q.is_cuda
    if interpreted() == on_gpu:
        raise ValueError(f"triton_flash_attention: tensors on {q.device} but Triton is "
                         f"{'interpreting (CPU tensors only)' if interpreted() else 'compiling (CUDA tensors only)'}")
    allowed = GPU_DTYPES if on_gpu else (torch.float32,)
    if q.dtype not in allowed:
        raise TypeError(f"triton_flash_attention: dtype {q.dtype} not supported here (supported: {allowed}); "
                        "use camplib.kernels.flash.flash_attention")
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"triton_flash_attention: {name}={b} must be a power of two >= 16 (tl.dot's minimum)")
    B, H, L, E = q.shape
    Hkv, S = k.size(1), k.size(2)
    block_d = max(16, triton.next_power_of_2(E))
    if block_d > 256:
        raise ValueError(f"triton_flash_attention: head_dim={E} > 256 does not fit one tile")
    o = torch.empty(B, H, L, v.size(-1), dtype=q.dtype, device=q.device)
    lse = torch.empty(B, H, L, dtype=torch.float32, device=q.device)
    kpm = key_padding_mask.to(torch.int8).contiguous() if key_padding_mask is not None else torch.ones(1, 1, dtype=torch.int8, device=q.device)
    grid = (triton.cdiv(L, block_q), B * H)
    _flash_forward_kernel[grid](q, k, v, o, lse, kpm,
                                *q.stride(), *k.stride(), *v.stride(), *o.stride(), lse.stride(0), lse.stride(1),
                                kpm.stride(0), H, H // Hkv, L, S, E, scale, S - L,
                                HAS_KPM=key_padding_mask is not None, IS_CAUSAL=bool(is_causal),
                                BLOCK_Q=block_q, BLOCK_K=block_k, BLOCK_D=block_d)
    return o, lse


def triton_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                           key_padding_mask: torch.Tensor | None = None, scale: float | None = None,
                           block_q: int = 64, block_k: int = 64) -> torch.Tensor:
    """The arguments and the result of camplib.kernels.flash.flash_attention, forward in Triton.
    Block sizes are powers of two >= 16; head_dim up to 256 (padded to a power of two)."""
    check_inputs(q, k, v, key_padding_mask, block_q, block_k)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    return FlashAttention.apply(q, k, v, key_padding_mask, bool(is_causal), scale, block_q, block_k, triton_flash_forward)
