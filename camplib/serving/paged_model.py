"""camplib's GPT run over a paged KV cache: the same modules and weights as `GPT.forward`
(camplib.model), layer by layer, but keys/values go to and come from `PagedKVPool` blocks.

One forward per engine step, as in vLLM and nano-vllm: the new tokens of every row of the step
are laid end to end into one flat batch of N tokens (`StepBatch`), so every weight matrix is read
once per step, in one (N, d) product, however many sequences are prefilled or decoded. Two kinds
of row, decode rows first:
- decode: one new token of a sequence (its newest); its query attends to all its sequence's
  cached keys, gathered block by block through its block table (`tables`) with a mask past its
  length (the query heads of one kv head laid out as its rows, so each key is read once);
- chunk: T new tokens of a sequence (a prompt, or a slice of one under chunked prefill; after a
  preemption also the earlier output). A chunk with nothing cached before it attends causally
  over its own keys; one that continues a cached prefix gathers its blocks like a decode row,
  keeps its first cached + T keys and attends causally over them (the T queries are the last T
  positions: `attend`'s causal mask is bottom-right aligned).
Only attention knows about rows; embeddings, norms, projections and the MLP see N tokens. Every
token's key/value is written to its slot before attention reads; the logits are those of each
row's last token.
Call under torch.no_grad().
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from camplib.attention import attend
from camplib.attention_backend import choose
from camplib.serving.kv_pool import PagedKVPool

__all__ = ["Chunk", "StepBatch", "paged_forward"]


@dataclass
class Chunk:
    length: int                    # T new tokens of one sequence
    cached: int = 0                # tokens of it already in the cache, before these T
    table: torch.Tensor | None = None   # (1, W) its blocks, when cached > 0


@dataclass
class StepBatch:
    tokens: torch.Tensor           # (N,) token ids: decode rows' one token each, then the chunks' tokens
    positions: torch.Tensor        # (N,) each token's position in its sequence
    slots: torch.Tensor            # (N,) where its key/value goes: block * block_size + slot in the block
    n_decode: int                  # the first n_decode tokens are decode rows
    chunks: list[Chunk]            # then these rows of several tokens, in order
    tables: torch.Tensor | None = None   # (n_decode, W) block tables of the decode rows (padding: any block)
    context_mask: torch.Tensor | None = None   # (n_decode, 1, 1, W * block_size) 0 where a key is cached, else -inf

    @property
    def last(self) -> torch.Tensor:
        """Index of each row's last token in the flat batch."""
        ends, end = [], self.n_decode
        for c in self.chunks:
            end += c.length
            ends.append(end - 1)
        return torch.tensor(list(range(self.n_decode)) + ends, device=self.tokens.device)


def _backend(attn, q, k) -> str:
    """The attention backend for these shapes, resolved once per forward (not per layer)."""
    if attn.backend != "auto":
        return attn.backend
    return choose(q.device, q.dtype, (q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)), backward=False,
                  attend=attend)


def paged_forward(model, pool: PagedKVPool, batch: StepBatch) -> torch.Tensor:
    """-> logits (rows, vocab) of each row's last token, decode rows first."""
    N, nd = batch.tokens.numel(), batch.n_decode
    x = model.tok_emb(batch.tokens)
    if model.pos_emb is not None:
        x = x + model.pos_emb(batch.positions)
    rope = model.blocks[0].attn.rope
    if rope is not None:   # the angles of the N positions, looked up once for q and k of every layer
        cos, sin = (t[batch.positions][:, None, :].to(x.dtype) for t in (rope.cos, rope.sin))
    backends: dict[str, str] = {}
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
        qkv = attn.qkv(block.ln1(x))
        qk, v = qkv[:, :(H + Hkv) * D].view(N, H + Hkv, D), qkv[:, (H + Hkv) * D:].view(N, Hkv, D)
        if rope is not None:   # queries and keys turn by the same angles: one call for both
            qk = attn.rope.turn(qk, cos, sin)
        q, k = qk[:, :H], qk[:, H:]
        pool.write(layer, k, v, batch.slots)
        out = []
        if nd:   # (nd, Hkv, H / Hkv, D) queries over (nd, Hkv, S, D) gathered keys
            keys, values = pool.gather(layer, batch.tables)
            # the H / Hkv query heads that share a kv head are that head's rows: attention reads
            # each key once per kv head rather than once per query head (rows attend independently:
            # equal up to rounding, ~3e-7 on unit-scale inputs; a decoding step of SmolLM2 at 16
            # rows spent ~25% less time in attention, benchmarks/README.md)
            qd = q[:nd].reshape(nd, Hkv, H // Hkv, D)
            if "decode" not in backends:
                backends["decode"] = _backend(attn, qd, keys)
            out.append(attend(qd, keys, values, batch.context_mask, is_causal=False,
                              backend=backends["decode"]).reshape(nd, H * D))
        start = nd
        for c in batch.chunks:   # (1, H, T, D) queries over their own T keys, or over the gathered prefix + them
            T = c.length
            qp = q[start:start + T].transpose(0, 1)[None]
            if c.cached == 0:
                kp, vp = (t[start:start + T].transpose(0, 1)[None] for t in (k, v))
            else:
                kp, vp = (t[:, :, :c.cached + T] for t in pool.gather(layer, c.table))
            kind = "prefill" if c.cached == 0 else "chunk"
            if kind not in backends:
                backends[kind] = _backend(attn, qp, kp)
            out.append(attend(qp, kp, vp, is_causal=True, backend=backends[kind])[0].transpose(0, 1).reshape(T, H * D))
            start += T
        x = x + attn.proj(torch.cat(out) if len(out) > 1 else out[0])
        x = x + block.mlp(block.ln2(x))
    return model.lm_head(model.ln_f(x[batch.last] if batch.chunks else x))   # decode rows only: every token is a row's last
