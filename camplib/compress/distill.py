"""Knowledge distillation (Hinton et al. 2015): train a small student on a big teacher's
temperature-softened distribution as well as on the true next token.

    loss = alpha * T^2 * KL(softmax(z_t / T) || softmax(z_s / T)) + (1 - alpha) * CE(z_s, y)

The KL is averaged over *positions* (rows), summed over the vocabulary: torch's
`KLDivLoss(reduction="batchmean")` on (N, V) rows. reduction="mean" would also divide by V, making
the soft term vocabulary-size times too small. The T^2 factor keeps the soft term's gradient the
same size whatever T (its gradient scales as 1/T^2), so alpha means the same at every temperature.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["distillation_loss"]


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
                      temperature: float = 2.0, alpha: float = 0.5, ignore_index: int = -100) -> torch.Tensor:
    """student/teacher logits (..., V), targets (...) ints -> scalar loss (formula above).

    The teacher gets no gradient. Positions whose target is `ignore_index` are left out of both
    terms (they are padding), and the KL is averaged over the positions that remain.
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ in shape (same vocabulary needed)")
    if targets.shape != student_logits.shape[:-1]:
        raise ValueError(f"targets {tuple(targets.shape)} must be the logits' shape without the vocabulary "
                         f"{tuple(student_logits.shape[:-1])}")
    if not temperature > 0 or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"need temperature > 0 and alpha in [0, 1], got T={temperature}, alpha={alpha}")
    V = student_logits.shape[-1]
    keep = targets.reshape(-1) != ignore_index
    if not bool(keep.any()):
        raise ValueError(f"every target is ignore_index={ignore_index}: no position to distil on")
    s = student_logits.reshape(-1, V)[keep]
    t = teacher_logits.detach().reshape(-1, V)[keep]
    dtype = torch.promote_types(s.dtype, torch.float32)     # log-softmax of bf16 logits in fp32
    log_p_s = F.log_softmax(s.to(dtype) / temperature, dim=-1)
    log_p_t = F.log_softmax(t.to(dtype) / temperature, dim=-1)
    soft = F.kl_div(log_p_s, log_p_t, reduction="batchmean", log_target=True) * temperature ** 2
    hard = F.cross_entropy(s.to(dtype), targets.reshape(-1)[keep])
    return alpha * soft + (1.0 - alpha) * hard
