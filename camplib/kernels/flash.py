"""FlashAttention-2 (Dao 2023) in plain PyTorch: exact attention in tiles, O(N) memory.

The math version (`camplib.attention.scaled_dot_product_attention`) builds the (L, S) score and
weight matrices and autograd keeps them for backward: memory grows as N^2. Here queries are cut
into tiles of `block_q` rows and keys/values into tiles of `block_k` rows:

- forward, per query tile: walk over the key tiles keeping, per row, the running max m, the
  running sum l of exp(s - m) and the unnormalised output acc. When a new tile raises the max
  from m to m', everything accumulated so far was scaled by exp(-m) instead of exp(-m'): multiply
  l and acc by alpha = exp(m - m') before adding the new tile (the online softmax). At the end
  O = acc / l, and the log-sum-exp L = m + log(l) is the only per-row statistic kept.
- backward: recompute each tile's weights P = exp(S - L) from q, k and the saved L (no N^2
  storage), and use D = rowsum(dO * O) = rowsum(P * dP) for the softmax's backward
  dS = P * (dP - D), which would otherwise need a whole row of P at once.

What autograd keeps is q, k, v (the inputs), O and L: O(N) per head. L, the log-sum-exp of each
query's scaled, masked scores (logsumexp over keys of q k^T * scale), has q's shape without its
feature dimension: (B, H, L) for (B, H, L, E) inputs, FlashAttention-2's `softmax_lse` layout, and
(B, L) for inputs without a head dimension, (B, L, E) (one head). In the compute dtype (fp32 for
fp16/bf16 inputs); -inf for a query that may attend to nothing.

Masks: `is_causal` is aligned to the bottom right like `camplib.attention.causal_mask` (query i
of L sits at position S - L + i; the usual triangle when L == S), and `key_padding_mask` (B, S),
True = may attend, hides padded keys. Tiles that the causal mask hides completely are skipped.
A query that may attend to nothing gets zeros (and zero gradients), as in camplib.attention.
GQA: k and v carry n_kv_heads <= n_heads heads; query head h reads kv head h // (n_heads //
n_kv_heads), without copying k and v per query head.

Every tile runs in at least fp32 (fp16/bf16 inputs are computed in fp32, the output is cast
back); fp64 stays fp64, so the tests can compare to ~1e-12.
"""
from __future__ import annotations

import math

import torch

__all__ = ["flash_attention", "FlashAttention", "flash_forward", "flash_backward", "check_inputs"]

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_inputs(q, k, v, key_padding_mask, block_q, block_k) -> None:
    """Raise a ValueError/TypeError naming what is wrong, so bad input never gives silent numbers."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flash_attention: {name} must be a tensor, got {type(t).__name__}")
        if t.dim() not in (3, 4) or t.dim() != q.dim():
            raise ValueError(f"flash_attention: q, k, v must all be (batch, heads, time, head_dim) or all "
                             f"(batch, time, head_dim), got {name} of shape {tuple(t.shape)} with q {tuple(q.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"flash_attention: {name} has dtype {t.dtype}; supported: {SUPPORTED_DTYPES}")
    q, k, v = _with_heads(q), _with_heads(k), _with_heads(v)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"flash_attention: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if not (q.device == k.device == v.device):
        raise ValueError(f"flash_attention: q, k, v on different devices ({q.device}, {k.device}, {v.device})")
    (B, H, L, E), (Bk, Hkv, S, Ek) = q.shape, k.shape
    if k.shape != v.shape[:3] + (Ek,) or v.shape[:3] != (Bk, Hkv, S):
        raise ValueError(f"flash_attention: k {tuple(k.shape)} and v {tuple(v.shape)} must agree on batch, heads, time")
    if Bk != B or Ek != E:
        raise ValueError(f"flash_attention: q {tuple(q.shape)} and k {tuple(k.shape)} must agree on batch and head_dim")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"flash_attention: n_heads={H} must be a multiple of n_kv_heads={Hkv}")
    if E == 0:
        raise ValueError("flash_attention: head_dim must be at least 1")
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if not isinstance(b, int) or isinstance(b, bool) or b < 1:
            raise ValueError(f"flash_attention: {name} must be a positive int, got {b!r}")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
            raise TypeError("flash_attention: key_padding_mask must be a bool tensor (True = may attend)")
        if key_padding_mask.shape != (B, S):
            raise ValueError(f"flash_attention: key_padding_mask must be (batch, keys) = {(B, S)}, "
                             f"got {tuple(key_padding_mask.shape)}")


def _with_heads(t: torch.Tensor) -> torch.Tensor:
    """(B, T, E) -> (B, 1, T, E), a view: inputs without a head dimension are one head."""
    return t.unsqueeze(1) if t.dim() == 3 else t


def _tile_scores(qi, kj, scale, r0, c0, causal_shift, kpm_j):
    """Scores of query rows r0.. against key columns c0.., with the masks applied as -inf.
    qi: (B, Hkv, G, bq, E), kj: (B, Hkv, 1, bk, E) -> (B, Hkv, G, bq, bk).
    The causal test compares *absolute* positions: row r0 + a against column c0 + b."""
    s = (qi @ kj.transpose(-2, -1)) * scale
    if causal_shift is not None:
        rows = torch.arange(r0, r0 + s.size(-2), device=s.device)[:, None]
        cols = torch.arange(c0, c0 + s.size(-1), device=s.device)[None, :]
        s = s.masked_fill(cols > rows + causal_shift, float("-inf"))
    if kpm_j is not None:
        s = s.masked_fill(~kpm_j[:, None, None, None, :], float("-inf"))
    return s


def _key_tiles(r0, r1, S, block_k, causal_shift):
    """Start columns of the key tiles a query tile of rows r0..r1-1 must visit: with the causal
    mask, tiles left of the last row's diagonal only (the rest are entirely -inf)."""
    end = S if causal_shift is None else max(0, min(S, r1 + causal_shift))
    return range(0, end, block_k)


def flash_forward(q, k, v, *, scale, is_causal, key_padding_mask, block_q, block_k):
    """(O, lse): O (B, H, L, E) in q's dtype and lse (B, H, L) in the compute dtype
    (-inf for a query that may attend to nothing). Inputs already checked."""
    B, H, L, E = q.shape
    Hkv, S = k.size(1), k.size(2)
    G = H // Hkv
    work = torch.promote_types(q.dtype, torch.float32)
    qg = q.to(work).reshape(B, Hkv, G, L, E)          # group g of kv head j = query heads j*G .. j*G+G-1
    kg, vg = k.to(work).unsqueeze(2), v.to(work).unsqueeze(2)  # (B, Hkv, 1, S, E): broadcast, no copies
    shift = (S - L) if is_causal else None
    out = torch.zeros(B, Hkv, G, L, v.size(-1), dtype=work, device=q.device)
    lse = torch.full((B, Hkv, G, L), float("-inf"), dtype=work, device=q.device)
    for r0 in range(0, L, block_q):
        r1 = min(L, r0 + block_q)
        qi = qg[..., r0:r1, :]
        m = torch.full(qi.shape[:-1], float("-inf"), dtype=work, device=q.device)  # running max
        l = torch.zeros_like(m)                                                      # running sum
        acc = torch.zeros(*qi.shape[:-1], v.size(-1), dtype=work, device=q.device)   # sum of p v
        for c0 in _key_tiles(r0, r1, S, block_k, shift):
            c1 = min(S, c0 + block_k)
            kpm_j = None if key_padding_mask is None else key_padding_mask[:, c0:c1]
            s = _tile_scores(qi, kg[..., c0:c1, :], scale, r0, c0, shift, kpm_j)
            m_new = torch.maximum(m, s.amax(dim=-1))
            m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # nothing seen yet: exp gives 0, not NaN
            p = torch.exp(s - m_safe[..., None])
            alpha = torch.exp(m - m_safe)                             # rescale what was summed under the old max
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + p @ vg[..., c0:c1, :]
            m = m_new
        seen = l > 0
        out[..., r0:r1, :] = acc / torch.where(seen, l, 1.0)[..., None]
        lse[..., r0:r1] = torch.where(seen, m + torch.log(torch.where(seen, l, 1.0)), float("-inf"))
    return out.reshape(B, H, L, -1).to(q.dtype), lse.reshape(B, H, L)


def flash_backward(q, k, v, o, lse, do, *, scale, is_causal, key_padding_mask, block_q, block_k):
    """(dq, dk, dv) by recomputing each tile's weights P = exp(S - lse); dS = P * (dP - D) with
    D = rowsum(dO * O). Outer loop over key tiles (each dk, dv tile is finished in one place),
    inner loop over the query tiles that can see it."""
    B, H, L, E = q.shape
    Hkv, S = k.size(1), k.size(2)
    G = H // Hkv
    work = lse.dtype
    qg = q.to(work).reshape(B, Hkv, G, L, E)
    dog = do.to(work).reshape(B, Hkv, G, L, -1)
    kg, vg = k.to(work).unsqueeze(2), v.to(work).unsqueeze(2)
    D = (dog * o.to(work).reshape(B, Hkv, G, L, -1)).sum(dim=-1)     # (B, Hkv, G, L)
    lse_g = lse.reshape(B, Hkv, G, L)
    lse_g = lse_g.masked_fill(lse_g == float("-inf"), 0.0)            # fully masked rows: their p is exp(-inf) = 0
    shift = (S - L) if is_causal else None
    dq = torch.zeros_like(qg)
    dk = torch.zeros(B, Hkv, S, E, dtype=work, device=q.device)
    dv = torch.zeros(B, Hkv, S, v.size(-1), dtype=work, device=q.device)
    for c0 in range(0, S, block_k):
        c1 = min(S, c0 + block_k)
        kj, vj = kg[..., c0:c1, :], vg[..., c0:c1, :]
        kpm_j = None if key_padding_mask is None else key_padding_mask[:, c0:c1]
        first_row = 0 if shift is None else max(0, c0 - shift)        # rows above can't see this tile
        for r0 in range(first_row - first_row % block_q, L, block_q):
            r1 = min(L, r0 + block_q)
            qi, doi = qg[..., r0:r1, :], dog[..., r0:r1, :]
            s = _tile_scores(qi, kj, scale, r0, c0, shift, kpm_j)
            p = torch.exp(s - lse_g[..., r0:r1, None])                  # the forward's weights, recomputed
            dv[:, :, c0:c1] += (p.transpose(-2, -1) @ doi).sum(dim=2)   # sum over the G query heads
            dp = doi @ vj.transpose(-2, -1)
            ds = p * (dp - D[..., r0:r1, None])
            dq[..., r0:r1, :] += (ds @ kj) * scale
            dk[:, :, c0:c1] += ((ds.transpose(-2, -1) @ qi) * scale).sum(dim=2)
    return dq.reshape(B, H, L, E).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class FlashAttention(torch.autograd.Function):
    """Autograd saves q, k, v, O and lse, never a tile: backward recomputes them. lse is saved in
    the conventional layout, q's shape without the feature dimension: (B, H, L), or (B, L) for
    3-D inputs (see the module docstring).

    `forward_kernel` computes (O, lse) with flash_forward's keyword arguments; it is the one
    thing that differs between implementations (flash_forward here, the Triton kernel in
    camplib.kernels.triton_flash). Whatever produced the lse, backward is flash_backward."""

    @staticmethod
    def forward(ctx, q, k, v, key_padding_mask, is_causal, scale, block_q, block_k, forward_kernel=flash_forward):
        o, lse = forward_kernel(_with_heads(q), _with_heads(k), _with_heads(v), scale=scale, is_causal=is_causal,
                                key_padding_mask=key_padding_mask, block_q=block_q, block_k=block_k)
        if q.dim() == 3:                          # no head dimension in, none out
            o, lse = o.squeeze(1), lse.squeeze(1)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.key_padding_mask = key_padding_mask   # bool mask, no gradient: kept as is
        ctx.settings = dict(scale=scale, is_causal=is_causal, block_q=block_q, block_k=block_k)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        no_heads = q.dim() == 3
        if no_heads:
            q, k, v, o, lse, do = (t.unsqueeze(1) for t in (q, k, v, o, lse, do))
        dq, dk, dv = flash_backward(q, k, v, o, lse, do, key_padding_mask=ctx.key_padding_mask, **ctx.settings)
        if no_heads:
            dq, dk, dv = dq.squeeze(1), dk.squeeze(1), dv.squeeze(1)
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
                    key_padding_mask: torch.Tensor | None = None, scale: float | None = None,
                    block_q: int = 64, block_k: int = 64) -> torch.Tensor:
    """softmax(q k^T * scale + masks) v, computed in tiles; differentiable in q, k, v.

    q: (B, H, L, E); k, v: (B, Hkv, S, E) with H % Hkv == 0 (GQA), or all three (B, L|S, E)
    without a head dimension (one head); key_padding_mask: (B, S)
    bool, True = may attend; is_causal: bottom-right aligned (see the module docstring; equals
    torch's is_causal when L == S). scale defaults to 1/sqrt(E). Any strides are accepted (the
    tiles are slices and matmuls, not raw pointers). No dropout and no arbitrary attn_mask:
    those need the math path.
    """
    check_inputs(q, k, v, key_padding_mask, block_q, block_k)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else float(scale)
    return FlashAttention.apply(q, k, v, key_padding_mask, bool(is_causal), scale, block_q, block_k)
