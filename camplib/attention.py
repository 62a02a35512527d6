"""Attention from scratch: softmax, masks, scaled dot-product attention, a KV cache and
multi-head / grouped-query attention.

This is the course's reference code (lab b01): what students build, proven equal to
`torch.nn.functional.scaled_dot_product_attention`. `camplib.model`'s GPT trains on torch's fused
kernel by default (speed) and on this code with `GPTConfig(attention="math")`; both give the same
numbers (tests/camplib/test_attention_backends.py).
Tensors follow torch's layout: (batch, heads, time, features).

`attend` picks one of four backends that compute the same function: "math" (this file, the
default of `attend` and `MultiHeadAttention`), "matmul" (the same matmuls with torch's softmax
kernel, as transformers' eager attention: one pass over the scores each way where b01's softmax
takes ~6), "flash" (camplib.kernels.flash, lab a09: tiled, O(N) memory, key-padding masks only)
and "sdpa" (torch's fused kernel, usually the fast one); "auto" lets
`camplib.attention_backend.choose` pick "matmul" or "sdpa" for the tensors' device and dtype
(measured once where it matters: bf16/fp16 on a CPU; else "sdpa"; overridable).
`GPTConfig.attention` selects it for a model and defaults to "auto" (training speed); pass
attention="math" to run the model on exactly what b01 builds.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from camplib.rope import RotaryEmbedding

__all__ = ["softmax", "scaled_dot_product_attention", "causal_mask", "KVCache", "MultiHeadAttention", "attend",
           "BACKENDS"]

BACKENDS = ("math", "matmul", "flash", "sdpa", "auto")


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x) / sum(exp(x)) along `dim`, stable for large inputs.

    Subtracting the row max first leaves the result unchanged mathematically but keeps exp()
    from overflowing (exp(1e4) is inf in any float dtype).

    A row where every entry is -inf (a query that may attend to nothing) returns all zeros, not
    the NaN that torch.softmax gives: the attention output for such a query is then zero and its
    gradients stay finite, instead of one NaN poisoning a whole training step.
    """
    m = x.amax(dim=dim, keepdim=True).detach()  # the shift cancels out, so no gradient through it
    m = m.masked_fill(m == float("-inf"), 0.0)  # all -inf row: shift by 0 so exp gives 0, not NaN
    e = torch.exp(x - m)
    s = e.sum(dim=dim, keepdim=True)
    return e / s.masked_fill(s == 0, 1.0)  # 0 / 1 = 0 for all -inf rows, with a finite gradient


def causal_mask(L: int, S: int | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (L, S) mask, True = may attend, aligned to the *bottom right*.

    With a KV cache the L new queries are the last L of S positions: query i sits at absolute
    position S - L + i and may see keys j <= S - L + i. When L == S this is the usual lower
    triangle (`ones(L, S).tril()`). Note that `is_causal=True` in scaled_dot_product_attention
    is *top-left* aligned, like torch's; the two differ only when L != S.
    """
    S = L if S is None else S
    if L > S:
        raise ValueError(f"causal_mask: {L} queries cannot be the last positions of {S} keys")
    return torch.ones(L, S, dtype=torch.bool, device=device).tril(diagonal=S - L)


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, *, is_causal: bool = False,
                                 scale: float | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v, with the semantics of torch's F.scaled_dot_product_attention.

    q: (..., L, E), k: (..., S, E), v: (..., S, Ev) -> (..., L, Ev).
    attn_mask broadcasts to (..., L, S): a bool mask says True = may attend; a float mask is
    added to the scores (use -inf to block). is_causal applies torch's top-left aligned mask
    `ones(L, S).tril()`; passing it together with attn_mask is an error (use causal_mask() and
    combine the masks yourself). scale defaults to 1/sqrt(E) so scores keep unit variance.
    dropout_p drops attention weights, applied whenever > 0 (like torch: pass 0 at eval time).

    Arguments after attn_mask are keyword-only because torch's 4th positional one is dropout_p.

    One deliberate difference: a query row that may attend to nothing returns zeros (see
    softmax). torch 2.13 on CPU also returns zeros there; other kernels/versions may give NaN.
    """
    L, S = q.size(-2), k.size(-2)
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., L, S)
    if is_causal:
        if attn_mask is not None:
            raise ValueError("pass either attn_mask or is_causal=True, not both")
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = torch.where(attn_mask, scores, float("-inf"))
        else:
            scores = scores + attn_mask
    weights = softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return weights @ v


def _key_padding_mask(attn_mask: torch.Tensor, B: int, S: int) -> torch.Tensor:
    """The (B, S) key mask behind a bool attn_mask of shape (B or 1, 1, 1, S), the only mask the
    flash kernel takes; any other mask is an error rather than a silently different result."""
    if attn_mask.dtype != torch.bool or attn_mask.dim() != 4 or attn_mask.shape[1:3] != (1, 1) \
            or attn_mask.size(0) not in (1, B) or attn_mask.size(3) != S:
        raise ValueError(f"attention backend 'flash' takes only a bool key padding mask of shape (B, 1, 1, S) = "
                         f"{(B, 1, 1, S)}, got {attn_mask.dtype} {tuple(attn_mask.shape)}: use backend='math'")
    return attn_mask.expand(B, 1, 1, S).reshape(B, S)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None, *,
           is_causal: bool = True, backend: str = "math", dropout_p: float = 0.0) -> torch.Tensor:
    """Attention of q (B, H, T, D) over k, v (B, Hkv, S, D), H % Hkv == 0 (query head h reads kv
    head h // (H // Hkv)), with the chosen backend; all three give the same numbers (tested).

    is_causal is bottom-right aligned (causal_mask: the T queries are the last T of S positions,
    as with a KV cache). attn_mask (bool True = may attend, or additive float) broadcasts to
    (B, H, T, S) and is combined with the causal mask. "flash" takes only a bool key padding mask
    (B, 1, 1, S) and no dropout, and raises ValueError for anything else.
    """
    if backend not in BACKENDS:
        raise ValueError(f"attention backend {backend!r}, expected one of {BACKENDS}")
    if backend == "auto":
        from camplib.attention_backend import choose   # measured once per device, dtype and size class
        backend = choose(q.device, q.dtype, (q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)),
                         backward=torch.is_grad_enabled() and q.requires_grad, attend=attend)
    B, H, T, _ = q.shape
    Hkv, S = k.size(1), k.size(2)
    if backend == "flash":
        from camplib.kernels.flash import flash_attention  # lab a09's kernel, loaded only when chosen
        if dropout_p > 0.0:
            raise ValueError("attention backend 'flash' has no dropout: use backend='math' or 'sdpa' with dropout")
        kpm = None if attn_mask is None else _key_padding_mask(attn_mask, B, S)
        return flash_attention(q, k, v, is_causal=is_causal, key_padding_mask=kpm)
    gqa = {}
    if Hkv != H and backend == "sdpa" and q.device.type == "cpu":
        # torch's CPU kernel reads kv head h // (H // Hkv) itself: no copies of k and v (measured
        # ~20% less attention time). Not used on CUDA: which GPU kernels take enable_gqa depends
        # on the torch version, and an unsupported one falls back to the slow math kernel.
        gqa = {"enable_gqa": True}
    elif Hkv != H:  # query head h reads kv head h // (H // Hkv)
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    if backend == "sdpa" and attn_mask is None and (not is_causal or T == S):
        # no mask to build: torch's own flags pick its fastest kernel (top-left causal == bottom-right when T == S)
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, dropout_p=dropout_p, **gqa)
    if is_causal:
        causal = causal_mask(T, S, device=q.device)
        if attn_mask is None:
            attn_mask = causal
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask & causal
        else:
            attn_mask = torch.where(causal, attn_mask, float("-inf"))
    if backend == "sdpa":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=dropout_p, **gqa)
        if attn_mask.dtype == torch.bool:
            # a query that may attend to nothing (left padding) gets zeros, as "math" gives: torch's
            # CPU kernel does so, some GPU kernels give NaN there (and a NaN in a pad position's
            # values would reach real queries through 0 * NaN in the next layer)
            out = out.masked_fill(~attn_mask.any(dim=-1, keepdim=True), 0.0)
        return out
    if backend == "matmul":
        return _matmul_attention(q, k, v, attn_mask, dropout_p)
    return scaled_dot_product_attention(q, k, v, attn_mask, dropout_p=dropout_p)


def _matmul_attention(q, k, v, attn_mask, dropout_p: float) -> torch.Tensor:
    """scaled_dot_product_attention's function on torch's softmax kernel. Blocked scores get the
    dtype's lowest finite value instead of -inf (so a query with no key to attend to gets finite
    weights, and finite gradients), and such a query's output is then set to zeros, as "math" gives."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    lowest = torch.finfo(scores.dtype).min
    blocked = None   # (..., T, 1): the queries with no key to attend to
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, lowest)
        blocked = ~attn_mask.any(dim=-1, keepdim=True)
    elif attn_mask is not None:
        scores = (scores + attn_mask).clamp_min(lowest)
        blocked = torch.isneginf(attn_mask).all(dim=-1, keepdim=True)
    weights = F.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = weights @ v
    return out if blocked is None else out.masked_fill(blocked, 0.0)


class KVCache:
    """Keys and values of one attention layer for the tokens seen so far, shape
    (B, n_kv_heads, T, head_dim), so that decoding a new token costs one query, not a full pass.

    Storage is preallocated up to `max_len` and filled in place: no reallocation per token, and
    the memory cost is visible up front. Meant for inference (under torch.no_grad()).
    """

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None):
        self.k = torch.zeros(batch, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.max_len = max_len
        self.length = 0  # number of positions filled

    def update(self, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, n_kv_heads, T_new, head_dim) keys/values; return all keys/values so far."""
        start, end = self.length, self.length + k_new.size(2)
        if end > self.max_len:
            raise ValueError(f"KVCache full: {end} positions needed, max_len={self.max_len}")
        self.k[:, :, start:end] = k_new
        self.v[:, :, start:end] = v_new
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reset(self) -> None:
        self.length = 0


class MultiHeadAttention(nn.Module):
    """Multi-head attention with optional grouped-query attention (GQA) and RoPE.

    One fused Linear `qkv` produces the n_heads query heads, then n_kv_heads key heads, then
    n_kv_heads value heads (one matmul instead of three). With n_kv_heads < n_heads, each group
    of n_heads // n_kv_heads query heads shares one key/value head: the KV cache shrinks by that
    factor at little quality cost (GQA, Ainslie et al. 2023; n_kv_heads=1 is multi-query).
    `backend` is the attention kernel (see `attend`): "math" (default), "flash", "sdpa" or "auto".
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None, bias: bool = True,
                 rope: RotaryEmbedding | None = None, dropout: float = 0.0, backend: str = "math"):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"attention backend {backend!r}, expected one of {BACKENDS}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, (n_heads + 2 * n_kv_heads) * self.head_dim, bias=bias)
        self.proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)
        self.rope = rope
        self.dropout = dropout
        self.backend = backend
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = True,
                cache: KVCache | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, d_model) -> (B, T, d_model).

        attn_mask (bool True = may attend, or additive float), broadcastable to (B, H, T, S), is
        combined with the causal mask when is_causal. With a cache, the T new tokens sit at
        positions cache.length .. cache.length+T-1: RoPE starts there and the causal mask is
        bottom-right aligned over all S = cache.length + T keys. `positions` ((T,) or (B, T)
        integers) overrides where RoPE puts the new tokens, e.g. past the pads of a left-padded batch.
        """
        B, T, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv(x).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, Hkv, D).transpose(1, 2)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        offset = cache.length if cache is not None else 0
        if self.rope is not None:
            q, k = self.rope(q, offset, positions), self.rope(k, offset, positions)
        if cache is not None:
            k, v = cache.update(k, v)
        y = attend(q, k, v, attn_mask, is_causal=is_causal, backend=self.backend,
                   dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, H * D)
        return self.resid_dropout(self.proj(y))
