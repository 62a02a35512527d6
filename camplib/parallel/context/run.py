"""Runner for ring attention (lab a05, tests, benchmarks): a rank function plus one call of
camplib.dist.on_ranks. The full q, k, v are cut into sequence shards here, each of cp ranks runs
`attn_fn(q, k, v)` on its shard (and backward, when the output has a graph), and the shards are
joined back, so the caller compares with full attention directly.

Measured per rank: the largest tensor any op created during forward and backward (the attention
memory that matters: full attention's is the (T x T) scores), and the bytes sent.

The grader runs a05's ring forward on ranks it starts itself (autograder.checks.separate_ranks),
each holding only its own shard of q, k and v: `forward_inputs` / `forward_rank`, joined by
`joined_forward`.
"""
from __future__ import annotations

import torch

from camplib.dist import in_child, on_ranks
from camplib.parallel.context.ring import Ring, join_sequence, split_positions, split_sequence
from camplib.parallel.tensor.layers import largest_new_tensor

__all__ = ["run_ring_attention", "run_ring_forward", "largest_full_attention_bytes", "forward_inputs", "forward_rank",
           "joined_forward"]


def _backward(out: torch.Tensor, grad_out: torch.Tensor) -> None:
    """out.backward(grad_out), as the backward of a scalar: the same gradients (times exactly 1),
    without torch's check of a tensor gradient, which imports sympy (3-4 s in each forked rank)."""
    (out * grad_out).sum().backward()


def _ring_rank(rank, cp, attn_fn, q, k, v, grad_out, split):
    torch.manual_seed(0)
    local = [split_sequence(t, rank, cp, split).detach().clone().requires_grad_(True) for t in (q, k, v)]
    with largest_new_tensor() as measured:
        out = attn_fn(*local)
        if grad_out is not None and out.requires_grad:
            _backward(out, split_sequence(grad_out, rank, cp, split))
    grads = [t.grad if t.grad is not None else torch.full_like(t, float("nan")) for t in local]
    return {"out": out.detach(), "grad_q": grads[0], "grad_k": grads[1], "grad_v": grads[2],
            "largest_bytes": measured.largest, "has_grad": out.requires_grad}


def run_ring_attention(attn_fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: int,
                       grad_out: torch.Tensor | None = None, split: str = "zigzag", timeout: float = 30.0) -> dict:
    """`attn_fn(q_shard, k_shard, v_shard)` on cp ranks, each holding its `split` shard of the
    (batch, heads, time, head_dim) inputs. Returns the joined "out" and, with `grad_out`, the
    joined "grad_q", "grad_k", "grad_v" (nan where attn_fn built no graph); per rank
    "largest_bytes" and "bytes_sent"."""
    got = on_ranks(_ring_rank, cp, attn_fn, q, k, v, grad_out, split, timeout=timeout, run_timeout=10 * timeout)
    joined = {key: join_sequence(got[key], split) for key in ("out", "grad_q", "grad_k", "grad_v")}
    return {**joined, "largest_bytes": got["largest_bytes"], "bytes_sent": got["bytes_sent"],
            "has_grad": got["has_grad"][0]}


def largest_full_attention_bytes(fn, q, k, v, grad_out=None) -> int:
    """The largest tensor one process creates running `fn(q, k, v)` on the full sequence
    (and backward with `grad_out`): what ring attention's per-rank number is compared with.
    Measured in a forked child (camplib.dist.in_child): the caller runs no autograd, so it can
    still fork ranks that run backward on a machine with a GPU."""
    return in_child(_largest_full_attention_bytes, fn, q, k, v, grad_out)


def _largest_full_attention_bytes(fn, q, k, v, grad_out) -> int:
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with largest_new_tensor() as measured:
        out = fn(q, k, v)
        if grad_out is not None:
            _backward(out, grad_out)
    return measured.largest


def _forward_rank(rank, cp, fn, q, k, v, split):
    return forward_rank(rank, cp, fn, forward_inputs(q, k, v, cp, split)[rank])


def forward_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: int, split: str = "zigzag") -> list[dict]:
    """What `forward_rank` gets on each of cp ranks: its own `split` shard of q, k and v, and every
    rank's global positions. A rank's causal output needs the keys and values of the positions
    before its own, which other ranks hold (zig-zag: every rank's; contiguous: all but rank 0's)."""
    positions = [split_positions(q.shape[2], r, cp, split) for r in range(cp)]
    return [{"q": split_sequence(q, r, cp, split).clone(), "k": split_sequence(k, r, cp, split).clone(),
             "v": split_sequence(v, r, cp, split).clone(), "positions": positions} for r in range(cp)]


def forward_rank(rank: int, cp: int, fn, mine: dict) -> dict:
    """One rank of `run_ring_forward` holding only its `forward_inputs`: what
    autograder.checks.separate_ranks hands each rank."""
    local = [mine[key] for key in ("q", "k", "v")]
    with torch.no_grad():
        out = fn(*local, mine["positions"], Ring())
    if not isinstance(out, torch.Tensor) or out.shape != local[0].shape:
        raise ValueError(f"the ring attention on rank {rank} returned "
                         f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}, "
                         f"expected a tensor of its queries' shape {tuple(local[0].shape)}")
    return {"out": out}


def run_ring_forward(fn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: int, split: str = "zigzag",
                     timeout: float = 30.0) -> dict:
    """`fn(q_shard, k_shard, v_shard, positions, ring)` on cp ranks (lab a05's exercise: the
    forward of ring attention): positions[r] are rank r's global positions, `ring` a
    `camplib.parallel.context.ring.Ring`. Returns the joined "out", and "bytes_sent" per rank."""
    return joined_forward(on_ranks(_forward_rank, cp, fn, q, k, v, split, timeout=timeout, run_timeout=10 * timeout),
                          split)


def joined_forward(got: dict, split: str = "zigzag") -> dict:
    """on_ranks' format of `forward_rank` -> the joined "out" and "bytes_sent" per rank."""
    return {"out": join_sequence(got["out"], split), "bytes_sent": got["bytes_sent"]}
