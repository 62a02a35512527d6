"""Context parallelism: ring attention over sequence shards (Liu et al. 2023), causal, with the
load-balanced zig-zag split (Megatron-LM's and Llama 3's), forward and backward.

Each of cp ranks holds the queries, keys and values of its own tokens. Attention needs every
query against every earlier key, so the key/value blocks travel around a ring: at step s rank r
holds the block of rank (r - s) mod cp, attends its queries to it, and merges the partial result
into its running output with the log-sum-exp (the online softmax of FlashAttention). After cp
steps every query has seen every key, and no rank ever held more than two blocks: the (T x T)
score matrix becomes cp^2 blocks of (T/cp x T/cp), one at a time.

Causality crosses shards: a rank's local row i is the global position `positions[i]`, and the
mask of a block compares global positions (q_pos >= k_pos), never local indices (the typical
mistake: a lower-triangular mask on every block, which lets early shards see later ones).

With a contiguous split rank 0 only sees its own block while the last rank sees all of them:
the work is unbalanced. The zig-zag split cuts the sequence into 2cp chunks and gives rank r
chunks r and 2cp-1-r, so every rank does the same number of unmasked score entries.

Backward recomputes each block's probabilities from the saved log-sum-exp (nothing of size
T x T is kept), and sends the key/value gradients around the ring with their block: after cp
steps each gradient is back at the rank that owns the block. All sends go through
`camplib.dist.ring.exchange`, so launch's timeout bounds them.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from camplib.dist.ring import exchange, ring_neighbours

__all__ = ["SPLITS", "ContextShard", "Ring", "block_attention", "merge_partial", "ring_attention", "split_positions", "split_sequence",
           "join_sequence", "unmasked_entries"]

SPLITS = ("zigzag", "contiguous")
SEQ_DIM = 2   # q, k, v are (batch, heads, time, head_dim)


def split_positions(seq_len: int, rank: int, cp: int, split: str = "zigzag") -> torch.Tensor:
    """The global positions of the tokens rank `rank` holds, in its local order."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: choose one of {SPLITS}")
    if not 0 <= rank < cp:
        raise ValueError(f"rank {rank} is outside 0..{cp - 1} (cp={cp})")
    pieces = 2 * cp if split == "zigzag" else cp
    if seq_len % pieces:
        raise ValueError(f"seq_len={seq_len} is not divisible by {pieces} ({split} split over cp={cp})")
    size = seq_len // pieces
    if split == "contiguous":
        return torch.arange(rank * size, (rank + 1) * size)
    first, second = rank, 2 * cp - 1 - rank
    return torch.cat([torch.arange(first * size, (first + 1) * size), torch.arange(second * size, (second + 1) * size)])


def split_sequence(x: torch.Tensor, rank: int, cp: int, split: str = "zigzag", dim: int = SEQ_DIM) -> torch.Tensor:
    """Rank `rank`'s shard of a full-sequence tensor."""
    return x.index_select(dim, split_positions(x.shape[dim], rank, cp, split).to(x.device))


def join_sequence(shards: list[torch.Tensor], split: str = "zigzag", dim: int = SEQ_DIM) -> torch.Tensor:
    """The full-sequence tensor from every rank's shard (the inverse of `split_sequence`)."""
    cp = len(shards)
    seq_len = sum(s.shape[dim] for s in shards)
    order = torch.cat([split_positions(seq_len, r, cp, split) for r in range(cp)])
    out = torch.cat(shards, dim=dim)
    return out.index_select(dim, torch.argsort(order).to(out.device))


def _block_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """True where a query may see a key: causality by GLOBAL position."""
    return q_pos[:, None] >= k_pos[None, :]


def block_attention(q, k, v, q_pos, k_pos, scale: float | None = None):
    """(out, lse) of q against one key/value block, causal by global positions.

    out is normalised within the block; lse (batch, heads, time) is the log of the block's
    softmax denominator. A query that sees no key of the block gets out = 0 and lse = -inf, so
    that merging it changes nothing."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    mask = _block_mask(q_pos.to(q.device), k_pos.to(q.device))
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse[..., None]).masked_fill(~mask, 0.0)  # all-masked rows: nan -> 0
    return probs @ v, lse


def merge_partial(out, lse, block_out, block_lse):
    """Two partial attentions over disjoint keys -> one, each weighted by its share of the
    softmax denominator: exp(lse_i - lse_new). `out`'s lse must be finite (a query always sees
    itself in its own block, merged first)."""
    new_lse = torch.logaddexp(lse, block_lse)
    out = out * torch.exp(lse - new_lse)[..., None] + block_out * torch.exp(block_lse - new_lse)[..., None]
    return out, new_lse


def unmasked_entries(seq_len: int, rank: int, cp: int, split: str = "zigzag") -> int:
    """Score entries rank `rank` computes once masked ones are skipped: its share of the work."""
    q_pos = split_positions(seq_len, rank, cp, split)
    return int(sum(_block_mask(q_pos, split_positions(seq_len, src, cp, split)).sum() for src in range(cp)))


class Ring:
    """This rank's place on the ring of a context-parallel group: `rank`, `size`, and
    `pass_on(*tensors)`, which sends each tensor to the right neighbour and returns the ones of
    the same shapes received from the left (all posted at once: no deadlock; launch's timeout
    bounds them). `block` is `block_attention`, for code handed a Ring (lab a05's exercise)."""

    block = staticmethod(block_attention)

    def __init__(self, group=None):
        self.group = group
        self.rank, self.size, self._right, self._left = ring_neighbours(group)

    def pass_on(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        sent = [t.contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in sent]
        exchange(sent, received, self._right, self._left, self.group)
        return received


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, split, group):
        ring = Ring(group)
        rank, cp = ring.rank, ring.size
        seq_len = q.shape[SEQ_DIM] * cp
        q_pos = split_positions(seq_len, rank, cp, split)
        kv = torch.stack([k, v]).contiguous()
        out = lse = None
        for step in range(cp):
            src = (rank - step) % cp
            block_out, block_lse = block_attention(q, kv[0], kv[1], q_pos, split_positions(seq_len, src, cp, split))
            out, lse = (block_out, block_lse) if out is None else merge_partial(out, lse, block_out, block_lse)
            if step < cp - 1:
                kv, = ring.pass_on(kv)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.split, ctx.group = split, group
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        ring = Ring(ctx.group)
        rank, cp = ring.rank, ring.size
        seq_len = q.shape[SEQ_DIM] * cp
        q_pos = split_positions(seq_len, rank, cp, ctx.split)
        scale = 1.0 / math.sqrt(q.shape[-1])
        grad_out = grad_out.contiguous()
        delta = (grad_out * out).sum(-1, keepdim=True)           # rowsum(dO * O)
        grad_q = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        grad_kv = torch.zeros_like(kv)                           # travels with its block
        for step in range(cp):
            src = (rank - step) % cp
            mask = _block_mask(q_pos.to(q.device), split_positions(seq_len, src, cp, ctx.split).to(q.device))
            scores = (q @ kv[0].transpose(-2, -1)) * scale
            probs = torch.exp(scores.masked_fill(~mask, float("-inf")) - lse[..., None]).masked_fill(~mask, 0.0)
            grad_probs = grad_out @ kv[1].transpose(-2, -1)
            grad_scores = probs * (grad_probs - delta) * scale
            grad_q += grad_scores @ kv[0]
            grad_kv[0] += grad_scores.transpose(-2, -1) @ q
            grad_kv[1] += probs.transpose(-2, -1) @ grad_out
            if cp > 1:   # the gradient moves on with its block; the last hop takes it home
                if step == cp - 1:
                    grad_kv, = ring.pass_on(grad_kv)
                else:
                    kv, grad_kv = ring.pass_on(kv, grad_kv)
        return grad_q, grad_kv[0], grad_kv[1], None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, split: str = "zigzag", group=None) -> torch.Tensor:
    """Causal attention of this rank's shard of the sequence against the whole sequence.

    q, k, v: (batch, heads, local time, head_dim), this rank's tokens in the order
    `split_positions(local_time * cp, rank, cp, split)` gives (`split_sequence` cuts them).
    Equal to full causal attention's rows for those tokens, forward and backward. Without
    torch.distributed (or a group of one) it is plain causal attention."""
    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"ring_attention needs q, k, v of one shape (repeat GQA heads first): "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not dist.is_initialized():
        pos = torch.arange(q.shape[SEQ_DIM])
        return block_attention(q, k, v, pos, pos)[0]
    return _RingAttention.apply(q, k, v, split, group)


class ContextShard:
    """This rank's share of the sequence in a context-parallel group, for a model to hold: the
    global positions of its tokens (`positions`: what RoPE and a learned position table must
    use, since local row i is not position i) and causal attention of its queries against the
    whole sequence (`attend`: `ring_attention` over the group). camplib's tensor-parallel GPT
    takes one (`TensorParallelGPT(..., context=ContextShard(cp_group))`), so the hybrid trainer's
    positions, masks and attention all follow the same split."""

    def __init__(self, group=None, split: str = "zigzag"):
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: choose one of {SPLITS}")
        self.group, self.split = group, split
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.size = dist.get_world_size(group) if dist.is_initialized() else 1

    def positions(self, local_len: int, device=None) -> torch.Tensor:
        """Global positions of this rank's `local_len` tokens, in its local order."""
        return split_positions(local_len * self.size, self.rank, self.size, self.split).to(device)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ring_attention(q, k, v, self.split, self.group)

    def __repr__(self) -> str:
        return f"ContextShard(rank {self.rank} of cp={self.size}, {self.split})"
