"""Cross-entropy from scratch: the loss every language model is trained on.

For logits z (one row per position, C classes) and target class y,

    loss = -log softmax(z)_y = logsumexp(z) - z_y.

`exp` overflows fp32 at z ~ 89 and underflows to 0 at z ~ -104, so the textbook
`-log(exp(z_y) / sum exp(z))` gives inf or NaN on large logits. Subtracting the row maximum m
first fixes it: logsumexp(z) = m + log(sum exp(z - m)), every exponent is <= 0 and the largest
term is exactly 1, so the sum lies in [1, C] and its log is finite. This holds for logits of
any size (tested at +-1e4).

Label smoothing (Szegedy et al. 2016, torch's convention): the target distribution is
(1 - eps) one-hot(y) + eps / C on every class, so

    loss = (1 - eps) (logsumexp(z) - z_y) + eps (logsumexp(z) - mean_c z_c).

Positions whose target is `ignore_index` (padding, prompt tokens) contribute nothing, and the
"mean" reduction divides by the number of the others. A batch where *every* target is ignored
therefore has mean 0/0 = NaN, exactly like `torch.nn.functional.cross_entropy`; its gradient
is all zeros (no position is selected), as torch's is. "sum" gives 0, "none" gives zeros, both
with zero gradients. Guard for it before calling (camplib.trainer.accumulate_gradients skips such micro-batches).

The backward pass is autograd's, through the stable formula above: d loss / d z = softmax(z) -
target distribution, equal to torch's own kernel (tests/camplib/test_losses.py: forward and
gradients in fp32 and fp64, with ignored positions, smoothing and huge logits).

Layout: the class dimension is the *last* one (logits (..., C), targets (...)), the shape a
language model produces; torch's function wants it at dim 1 for more than 2 dimensions.
"""
from __future__ import annotations

import torch

__all__ = ["cross_entropy", "log_softmax"]


def _shifted(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(z - m, log sum exp(z - m)) with m the row max: every exponent <= 0, the sum in [1, C].

    Losses are computed from z - m, never from logsumexp(z) = m + ... itself: with |z| ~ 1e4,
    adding m back and subtracting z_y would cancel catastrophically in fp32 (ulp(1e4) ~ 1e-3)."""
    m = logits.amax(dim=-1, keepdim=True).detach()  # a constant shift: it cancels in the gradient
    # A row of all -inf would give m = -inf and (z - m) = NaN; shift it by 0 instead.
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    shifted = logits - m
    return shifted, shifted.exp().sum(dim=-1).log()


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log softmax over the last dim, stable for any logit size: (z - m) - log sum exp(z - m)."""
    shifted, lse = _shifted(logits)
    return shifted - lse.unsqueeze(-1)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100,
                  label_smoothing: float = 0.0, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of `logits` (..., C) against integer `targets` (...), like
    `F.cross_entropy(logits.reshape(-1, C), targets.reshape(-1), ...)`.

    reduction: "mean" (over non-ignored positions; NaN if there are none, as in torch), "sum",
    or "none" (shape of targets, 0 at ignored positions). Computed in the logits' dtype: cast
    bf16/fp16 logits to fp32 first (camplib.model.GPT does).
    """
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if logits.dim() < 1 or logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits (..., C) and targets (...) disagree: logits {tuple(logits.shape)}, "
                         f"targets {tuple(targets.shape)}")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise TypeError(f"targets must be integer class ids, got {targets.dtype}")
    n_classes = logits.size(-1)
    valid = targets != ignore_index
    bad = valid & ((targets < 0) | (targets >= n_classes))
    if bool(bad.any()):
        raise ValueError(f"target {int(targets[bad][0])} is outside [0, {n_classes}) and is not "
                         f"ignore_index={ignore_index}")
    shifted, lse = _shifted(logits)  # -log p_y = lse - (z_y - m): only the target's entry, not all of log p
    safe_targets = torch.where(valid, targets, torch.zeros_like(targets)).long()
    nll = lse - shifted.gather(-1, safe_targets.unsqueeze(-1)).squeeze(-1)
    if label_smoothing > 0:
        # eps/C on every class: the mean over classes of -log p_c = lse - mean(z - m), weighted by eps
        nll = (1.0 - label_smoothing) * nll + label_smoothing * (lse - shifted.mean(dim=-1))
    per_position = torch.where(valid, nll, torch.zeros_like(nll))
    if reduction == "none":
        return per_position
    total = per_position.sum()
    if reduction == "sum":
        return total
    return total / valid.sum().to(total.dtype)
