"""Choosing hyperparameters by Bayesian search with Optuna instead of by guessing.

- TPE sampler (Tree-structured Parzen Estimator, Bergstra et al. 2011): after `n_startup_trials`
  random trials it models the good and the bad hyperparameters separately and proposes points
  where good / bad is largest, so later trials concentrate where the loss was low.
- Median pruner: a trial reports its validation loss every few steps (`trial.report`); once
  `n_startup_trials` trials have finished, a trial whose loss at step s is worse than the median
  of earlier trials at step s is stopped (`trial.should_prune()` -> raise `optuna.TrialPruned`),
  so the budget goes to promising settings.
- A budget in trials AND seconds (`n_trials`, `timeout_s`): the study stops at whichever comes first.

The objective is `objective(trial, train) -> float`: it suggests the hyperparameters, calls
`train(hparams, report)` (which trains and calls `report(step, val_loss)` at each evaluation)
and returns the final validation loss. `run_study` binds `train`, so the same objective runs on
real training (camplib.codegen.pretrain) and on synthetic curves (tuning_harness).
"""
from __future__ import annotations

import math
from typing import Callable

__all__ = ["make_study", "run_study", "trials_table", "plot_history", "plot_importances", "importances"]


def make_study(seed: int = 0, n_startup_trials: int = 2, n_warmup_steps: int = 0, tpe_startup: int = 3):
    """A minimising study with a seeded TPE sampler and a median pruner."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)   # one INFO line per trial on stderr otherwise
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=tpe_startup)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=n_startup_trials, n_warmup_steps=n_warmup_steps)
    return optuna.create_study(direction="minimize", sampler=sampler, pruner=pruner)


def run_study(objective: Callable, train: Callable, n_trials: int, timeout_s: float | None = None, seed: int = 0,
              n_startup_trials: int = 2, n_warmup_steps: int = 0, tpe_startup: int = 3):
    """Optimise objective(trial, train) for at most n_trials trials and timeout_s seconds.

    Exceptions other than TrialPruned propagate (a broken objective should fail loudly, not
    become a FAIL trial among many)."""
    study = make_study(seed, n_startup_trials, n_warmup_steps, tpe_startup)
    study.optimize(lambda trial: objective(trial, train), n_trials=n_trials, timeout=timeout_s, catch=())
    return study


def _distribution(d) -> dict:
    import optuna

    if isinstance(d, optuna.distributions.CategoricalDistribution):
        return {"type": "categorical", "choices": list(d.choices)}
    kind = "int" if isinstance(d, optuna.distributions.IntDistribution) else "float"
    return {"type": kind, "low": d.low, "high": d.high, "log": bool(d.log), "step": d.step}


def trials_table(study) -> list[dict]:
    """Every trial as plain data: number, state, value, params, their distributions, and the
    intermediate values as [step, value] pairs in step order."""
    return [{"number": t.number, "state": t.state.name, "value": t.value, "params": dict(t.params),
             "distributions": {k: _distribution(d) for k, d in t.distributions.items()},
             "intermediate": sorted([int(s), float(v)] for s, v in t.intermediate_values.items()),
             "seconds": t.duration.total_seconds() if t.duration is not None else None}
            for t in study.trials]


def plot_history(study, ax=None):
    """Each trial's final (complete) or last reported (pruned) validation loss, and the best so far."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    best = math.inf
    xs, bests = [], []
    for t in study.trials:
        last = t.value if t.value is not None else (t.intermediate_values[max(t.intermediate_values)]
                                                    if t.intermediate_values else None)
        if last is None:
            continue
        pruned = t.state.name == "PRUNED"
        ax.scatter([t.number], [last], marker="x" if pruned else "o", color="tab:red" if pruned else "tab:blue")
        if not pruned:
            best = min(best, last)
        xs.append(t.number)
        bests.append(best)
    ax.step(xs, bests, where="post", color="tab:green", label="best complete trial so far")
    ax.scatter([], [], marker="o", color="tab:blue", label="complete")
    ax.scatter([], [], marker="x", color="tab:red", label="pruned (last reported loss)")
    ax.set(xlabel="trial", ylabel="validation loss", title="Optuna: optimisation history")
    ax.legend()
    return ax


def importances(study) -> dict[str, float]:
    """optuna.importance.get_param_importances (fANOVA, a forest of 16 trees: a study of tens of
    trials needs no more) over the complete trials; {} when there are fewer than two complete
    trials with different values (nothing to attribute)."""
    import optuna

    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    if len(done) < 2 or len({t.value for t in done}) < 2:
        return {}
    return optuna.importance.get_param_importances(study, evaluator=optuna.importance.FanovaImportanceEvaluator(n_trees=16, seed=0))


def plot_importances(study, ax=None):
    """Bar chart of importances(study) (a note on the axes when there is nothing to show)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    imp = importances(study)
    if imp:
        names = list(imp)[::-1]
        ax.barh(names, [imp[n] for n in names])
    else:
        ax.text(0.5, 0.5, "fewer than 2 complete trials:\nno importances yet", ha="center", va="center",
                transform=ax.transAxes)
    ax.set(xlabel="importance (fANOVA, share of variance)", title="Optuna: hyperparameter importances")
    return ax
