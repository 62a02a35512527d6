"""Cross-entropy of a language-model head without the (tokens x vocab) logits.

A model's last step is logits = h W^T for N tokens and a vocabulary of V (W is the output
matrix, the token embedding when tied), then the loss. For a 128k vocabulary and 8k tokens
the fp32 logits alone are 4 GiB, and autograd keeps them (and their softmax) for backward.

Here the N rows are cut into chunks of `chunk_size`. Forward computes each chunk's logits,
its log-sum-exp and loss, and drops the logits; only the N log-sum-exps are kept. Backward
recomputes each chunk's logits and turns them into the gradient of the loss with respect to
them, softmax - onehot(target) (times the upstream gradient, over the number of counted
tokens), then dh_chunk = G W and dW += G^T h_chunk. At most chunk_size x V logits exist at a
time, forward and backward; the price is the head's matmul done twice.

Equals camplib.losses.cross_entropy(h @ W.T, targets) with ignore_index and "mean" or "sum"
reduction (no label smoothing here). Logits are computed in at least fp32 (fp64 stays fp64),
as camplib.model.GPT computes its loss.
"""
from __future__ import annotations

import torch

__all__ = ["chunked_cross_entropy", "ChunkedCrossEntropyFunction"]


def _chunk_logits(h, weight, work):
    return h.to(work) @ weight.to(work).T


class ChunkedCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, ignore_index, reduction, chunk_size):
        work = torch.promote_types(h.dtype, torch.float32)
        N = h.size(0)
        valid = targets != ignore_index
        lse = torch.empty(N, dtype=work, device=h.device)
        total = torch.zeros((), dtype=work, device=h.device)
        for r0 in range(0, N, chunk_size):
            r1 = min(N, r0 + chunk_size)
            z = _chunk_logits(h[r0:r1], weight, work)                 # (chunk, V): the only logits alive
            lse[r0:r1] = torch.logsumexp(z, dim=-1)
            safe = torch.where(valid[r0:r1], targets[r0:r1], 0)
            nll = lse[r0:r1] - z.gather(1, safe[:, None]).squeeze(1)
            total = total + torch.where(valid[r0:r1], nll, 0.0).sum()
        count = valid.sum()
        ctx.save_for_backward(h, weight, targets, lse)
        ctx.settings = (ignore_index, reduction, chunk_size, count)
        return total / count.to(work) if reduction == "mean" else total

    @staticmethod
    def backward(ctx, grad_loss):
        h, weight, targets, lse = ctx.saved_tensors
        ignore_index, reduction, chunk_size, count = ctx.settings
        work = lse.dtype
        scale = grad_loss.to(work) / count.to(work) if reduction == "mean" else grad_loss.to(work)
        valid = targets != ignore_index
        dh = torch.zeros_like(h) if ctx.needs_input_grad[0] else None
        dw = torch.zeros(weight.shape, dtype=work, device=weight.device) if ctx.needs_input_grad[1] else None
        for r0 in range(0, h.size(0), chunk_size):
            r1 = min(h.size(0), r0 + chunk_size)
            hc = h[r0:r1].to(work)
            g = torch.exp(_chunk_logits(h[r0:r1], weight, work) - lse[r0:r1, None])   # softmax, recomputed
            rows = torch.arange(r1 - r0, device=h.device)
            g[rows, torch.where(valid[r0:r1], targets[r0:r1], 0)] -= 1.0
            g = g * torch.where(valid[r0:r1], scale, 0.0)[:, None]                   # ignored rows: no gradient
            if dh is not None:
                dh[r0:r1] = (g @ weight.to(work)).to(h.dtype)
            if dw is not None:
                dw += g.T @ hc
        return dh, None if dw is None else dw.to(weight.dtype), None, None, None, None


def chunked_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                          ignore_index: int = -100, reduction: str = "mean", chunk_size: int = 1024) -> torch.Tensor:
    """cross_entropy(h @ weight.T, targets) for h (..., d), weight (V, d), targets (...) integer
    ids, computed chunk_size rows at a time; differentiable in h and weight. "mean" over the
    non-ignored targets (NaN when there are none, as torch and camplib.losses), or "sum"."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"chunked_cross_entropy: reduction must be 'mean' or 'sum', got {reduction!r}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunked_cross_entropy: chunk_size must be a positive int, got {chunk_size!r}")
    if not (h.is_floating_point() and weight.is_floating_point()):
        raise TypeError(f"chunked_cross_entropy: h and weight must be floating point, got {h.dtype}, {weight.dtype}")
    if weight.dim() != 2 or h.size(-1) != weight.size(1):
        raise ValueError(f"chunked_cross_entropy: weight must be (vocab, {h.size(-1)}), got {tuple(weight.shape)}")
    if h.shape[:-1] != targets.shape:
        raise ValueError(f"chunked_cross_entropy: h (..., d) and targets (...) disagree: h {tuple(h.shape)}, "
                         f"targets {tuple(targets.shape)}")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise TypeError(f"chunked_cross_entropy: targets must be integer class ids, got {targets.dtype}")
    flat_t = targets.reshape(-1).long()
    valid = flat_t != ignore_index
    bad = valid & ((flat_t < 0) | (flat_t >= weight.size(0)))
    if bool(bad.any()):
        raise ValueError(f"chunked_cross_entropy: target {int(flat_t[bad][0])} is outside [0, {weight.size(0)}) "
                         f"and is not ignore_index={ignore_index}")
    return ChunkedCrossEntropyFunction.apply(h.reshape(-1, h.size(-1)), weight, flat_t, ignore_index, reduction,
                                             chunk_size)
