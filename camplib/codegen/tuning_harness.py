"""Checking an Optuna objective in milliseconds: synthetic learning curves instead of training.

`synthetic_curve(hparams)` is a made-up validation-loss curve with a known best point (lr near
6e-3, batch 16, warm-up near 5). `synthetic_study(objective, ...)` runs camplib.codegen.tuning's
study with `train` replaced by one that "trains" by walking that curve, so a test can check from
plain data that the objective suggested the right hyperparameters, reported every value at its
step, let the median pruner stop bad trials, and returned the final loss. A runner (it calls
the objective it is given), kept apart from tuning so that module never imports it.
"""
from __future__ import annotations

import math

from camplib.codegen.tuning import run_study, trials_table

__all__ = ["EVAL_STEPS", "synthetic_curve", "synthetic_train", "synthetic_study"]

EVAL_STEPS = (10, 20, 30, 40, 50)


def synthetic_curve(hparams: dict) -> list[float]:
    """Validation loss at each of EVAL_STEPS: floor + 2/sqrt(step), floor set by the hyperparameters."""
    lr, batch, warmup = float(hparams["lr"]), int(hparams["batch_size"]), int(hparams["warmup"])
    floor = 2.0 + (math.log10(lr) - math.log10(6e-3)) ** 2 + 0.15 * abs(math.log2(batch / 16)) + 0.01 * abs(warmup - 5)
    return [floor + 2.0 / math.sqrt(s) for s in EVAL_STEPS]


def synthetic_train(hparams: dict, report) -> float:
    """What `train` does for a real run, on the synthetic curve: report each value, return the last."""
    curve = synthetic_curve(hparams)
    for step, value in zip(EVAL_STEPS, curve):
        report(step, value)
    return curve[-1]


def synthetic_study(objective, n_trials: int = 10, seed: int = 0) -> list[dict]:
    """trials_table of a study of objective on synthetic curves (median pruner after 2 trials)."""
    return trials_table(run_study(objective, synthetic_train, n_trials=n_trials, timeout_s=60, seed=seed,
                                  n_startup_trials=2))
