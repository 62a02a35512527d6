"""camplib's GPT run over a paged KV cache: the same modules and weights as `GPT.forward`
(camplib.model), layer by layer, but keys/values go to and come from `PagedKVPool` blocks.

Two kinds of call, as in vLLM:
- prefill: one sequence's tokens not cached yet (its prompt; after a preemption also its earlier
  output), causal attention over themselves, their keys/values written to the sequence's blocks;
- decode: one new token for each of B sequences of different lengths, attending to all its
  sequence's cached keys, gathered from the block tables with a mask past each length.
Both return the logits of each sequence's last token. Call under torch.no_grad().
"""
from __future__ import annotations

import torch

from camplib.attention import attend
from camplib.serving.kv_pool import PagedKVPool

__all__ = ["paged_forward"]


def paged_forward(model, pool: PagedKVPool, idx: torch.Tensor, positions: torch.Tensor, blocks: torch.Tensor,
                  slots: torch.Tensor, tables: torch.Tensor | None = None,
                  lengths: torch.Tensor | None = None) -> torch.Tensor:
    """idx, positions: (B, T); blocks, slots: (B * T,) where each token's keys/values go.

    tables/lengths None: prefill (B == 1, causal over the T tokens, which are all the sequence
    has). Otherwise decode (T == 1): tables (B, max_blocks), lengths (B,) tokens cached
    including this one. -> logits (B, vocab) of each row's last token.
    """
    B, T = idx.shape
    x = model.tok_emb(idx)
    if model.pos_emb is not None:
        x = x + model.pos_emb(positions)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        q, k, v = attn.qkv(block.ln1(x)).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = q.view(B, T, H, D).transpose(1, 2)
        k = k.view(B, T, Hkv, D).transpose(1, 2)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        if attn.rope is not None:
            q, k = attn.rope(q, 0, positions), attn.rope(k, 0, positions)
        pool.write(layer, k.transpose(1, 2).reshape(B * T, Hkv, D), v.transpose(1, 2).reshape(B * T, Hkv, D),
                   blocks, slots)
        if tables is None:
            y = attend(q, k, v, is_causal=True, backend=attn.backend)
        else:
            keys, values, mask = pool.gather(layer, tables, lengths)
            y = attend(q, keys.to(q.dtype), values.to(q.dtype), mask, is_causal=False, backend=attn.backend)
        x = x + attn.proj(y.transpose(1, 2).reshape(B, T, H * D))
        x = x + block.mlp(block.ln2(x))
    return model.lm_head(model.ln_f(x[:, -1]))
