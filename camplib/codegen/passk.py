"""pass@k: the chance that at least one of k programs a model writes for a problem passes its
tests (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", the HumanEval paper).

Draw n >= k samples per problem, run them, count the c that pass; the unbiased estimate of
pass@k for that problem is

    1 - C(n - c, k) / C(n, k)      (1 when n - c < k: every k-subset holds a passing sample)

the probability that k samples drawn without replacement from the n include a passing one;
the benchmark's figure is its mean over problems. C(n, k) overflows floats for n in the
hundreds, so it is computed as the product 1 - prod_{i = n-c+1}^{n} (1 - k / i) (the paper's
numerically stable form). Two shortcuts are wrong: c / n is pass@1 only (it ignores k), and
1 - (1 - c/n)^k, sampling with replacement, is biased low (its mean over draws of c is below the
true pass@k, by Jensen's inequality, most for small n). With greedy decoding (one sample,
temperature 0) pass@1 is simply the share of problems whose program passes.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["pass_at_k", "mean_pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with n samples of which c passed (0 <= c <= n, 1 <= k <= n)."""
    n, c, k = int(n), int(c), int(k)
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def mean_pass_at_k(samples: Sequence[int], correct: Sequence[int], k: int) -> float:
    """The benchmark's pass@k: the mean of pass_at_k over problems (n and c per problem)."""
    if len(samples) != len(correct) or not samples:
        raise ValueError(f"need as many sample counts as correct counts, at least one: {len(samples)}, {len(correct)}")
    return sum(pass_at_k(n, c, k) for n, c in zip(samples, correct)) / len(samples)
