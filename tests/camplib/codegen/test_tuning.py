"""The Optuna study: a correct objective reports every value, the median pruner stops bad trials,
the budget in seconds is respected, and the plots draw from study.trials."""
import time

import matplotlib
import optuna
import pytest

from camplib.codegen.tuning import importances, plot_history, plot_importances, run_study
from camplib.codegen.tuning_harness import EVAL_STEPS, synthetic_curve, synthetic_study

matplotlib.use("Agg")


def objective(trial, train):
    hp = {"lr": trial.suggest_float("lr", 1e-3, 3e-2, log=True),
          "batch_size": trial.suggest_categorical("batch_size", [8, 16, 32]),
          "warmup": trial.suggest_int("warmup", 0, 20)}

    def report(step, loss):
        trial.report(loss, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return train(hp, report)


def test_synthetic_study_prunes_and_reports_every_value():
    table = synthetic_study(objective, n_trials=10, seed=0)
    assert len(table) == 10
    assert {t["state"] for t in table} == {"COMPLETE", "PRUNED"}, [t["state"] for t in table]
    for t in table:
        curve = synthetic_curve(t["params"])
        assert t["intermediate"] == [[s, v] for s, v in zip(EVAL_STEPS, curve)][:len(t["intermediate"])]
        if t["state"] == "COMPLETE":
            assert len(t["intermediate"]) == len(EVAL_STEPS) and t["value"] == curve[-1]
    assert table[0]["distributions"]["lr"] == {"type": "float", "low": 1e-3, "high": 3e-2, "log": True, "step": None}


def test_seconds_budget_stops_the_study():
    def slow_train(hp, report):
        time.sleep(0.3)
        report(1, 1.0)
        return 1.0
    start = time.perf_counter()
    study = run_study(objective, slow_train, n_trials=100, timeout_s=0.5)
    assert time.perf_counter() - start < 5 and len(study.trials) < 10, len(study.trials)


def test_a_broken_objective_fails_loudly():
    def broken(trial, train):
        raise KeyError("lr")
    with pytest.raises(KeyError):
        run_study(broken, None, n_trials=2)


@pytest.mark.slow   # matplotlib and fANOVA: 3-8 s on 2 busy cores
def test_plots_and_importances():
    study = run_study(objective, lambda hp, report: synthetic_curve(hp)[-1], n_trials=6, seed=1)
    imp = importances(study)
    assert set(imp) == {"lr", "batch_size", "warmup"} and abs(sum(imp.values()) - 1) < 1e-6, imp
    assert plot_history(study).get_title() and plot_importances(study).get_title()
    one = run_study(objective, lambda hp, report: 1.0, n_trials=1)
    assert importances(one) == {} and plot_importances(one).texts   # says why instead of failing
