"""Learning-rate schedules: linear warm-up, then a linear or cosine decay.

Warm-up matters for Adam: its second-moment estimate is noisy for the first few hundred steps,
and full-size steps taken on it can throw a transformer into a bad region it never leaves.
The decay lets the final steps settle into a minimum instead of bouncing around it.

Convention (the one of Hugging Face's get_*_schedule_with_warmup): `step` counts optimizer
steps already taken, so the first update uses lr(0) = 0, lr(warmup) = peak_lr, lr(total) =
final_lr, and every step past `total` stays at final_lr.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

__all__ = ["warmup_linear", "warmup_cosine", "lr_lambda", "warmup_scheduler"]


def _check(warmup: int, total: int) -> None:
    if not 0 <= warmup <= total:
        raise ValueError(f"need 0 <= warmup <= total, got warmup={warmup}, total={total}")


def _decay_progress(step: int, warmup: int, total: int) -> float:
    """How far through the decay phase `step` is: 0 at the end of warm-up, 1 at `total`."""
    if total == warmup:
        return 1.0
    return min(1.0, (step - warmup) / (total - warmup))


def warmup_linear(step: int, warmup: int, total: int, peak_lr: float, final_lr: float = 0.0) -> float:
    """0 -> peak_lr linearly over `warmup` steps, then peak_lr -> final_lr linearly until `total`."""
    _check(warmup, total)
    if step < warmup:
        return peak_lr * step / warmup
    return final_lr + (peak_lr - final_lr) * (1.0 - _decay_progress(step, warmup, total))


def warmup_cosine(step: int, warmup: int, total: int, peak_lr: float, final_lr: float = 0.0) -> float:
    """0 -> peak_lr linearly over `warmup` steps, then half a cosine from peak_lr down to
    final_lr at `total`: flat near the peak and near the end, steepest in the middle."""
    _check(warmup, total)
    if step < warmup:
        return peak_lr * step / warmup
    progress = _decay_progress(step, warmup, total)
    return final_lr + (peak_lr - final_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


SCHEDULES = {"linear": warmup_linear, "cosine": warmup_cosine}


def lr_lambda(kind: str, warmup: int, total: int, final_ratio: float = 0.0) -> Callable[[int], float]:
    """The schedule as a multiplier of the peak lr (what LambdaLR wants): 1.0 at the peak,
    `final_ratio` at the end. A multiplier lets param groups with different lrs share it."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}, expected one of {sorted(SCHEDULES)}")
    _check(warmup, total)
    schedule = SCHEDULES[kind]

    def multiplier(step: int) -> float:
        return schedule(step, warmup, total, 1.0, final_ratio)
    return multiplier


def warmup_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup: int, total: int,
                     final_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR running `kind` ("linear" | "cosine"); each group's lr at construction is its
    peak. Call scheduler.step() after each optimizer.step(). Its state_dict holds only numbers
    (the multiplier is a plain function, which LambdaLR does not save), so it checkpoints."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(kind, warmup, total, final_ratio))
