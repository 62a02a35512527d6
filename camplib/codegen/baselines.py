"""The baseline a pretrained code model must beat: an interpolated token n-gram model.

P(t | previous n-1 tokens) mixes the maximum-likelihood estimates of every order 0..n-1 with
fixed weights (Jelinek-Mercer interpolation) and a uniform floor over the vocabulary, so no
held-out token has probability 0 (its log would be -inf). Counting is fast and needs no
gradient; for a small corpus a trigram is hard to beat, which makes it an honest baseline: a
transformer that loses to it has learned less than counting does.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import torch

__all__ = ["NgramModel"]


class NgramModel:
    """fit(streams) counts n-grams of token-id sequences; token_losses(stream) gives the
    negative log-likelihood (nats) of each token after the first, as the transformer's loss does."""

    def __init__(self, n: int, vocab_size: int, weights: Sequence[float] | None = None):
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n, self.vocab_size = n, vocab_size
        # weight of the uniform floor, then of orders 0 (unigram) .. n-1; higher orders get more
        raw = list(weights) if weights is not None else [0.01] + [2.0 ** k for k in range(n)]
        if len(raw) != n + 1 or min(raw) <= 0:
            raise ValueError(f"need {n + 1} positive weights (uniform, orders 0..{n - 1}), got {raw}")
        self.weights = [w / sum(raw) for w in raw]
        self.counts = [Counter() for _ in range(n)]    # order k: (context of k tokens, token) -> count
        self.context_totals = [Counter() for _ in range(n)]

    def fit(self, streams: Sequence[Sequence[int]]) -> "NgramModel":
        for stream in streams:
            stream = list(stream)
            for i, tok in enumerate(stream):
                for k in range(min(self.n, i + 1)):
                    context = tuple(stream[i - k:i])
                    self.counts[k][context, tok] += 1
                    self.context_totals[k][context] += 1
        return self

    def prob(self, context: Sequence[int], token: int) -> float:
        context = tuple(context)[-(self.n - 1):] if self.n > 1 else ()
        p = self.weights[0] / self.vocab_size
        used = self.weights[0]
        for k in range(self.n):
            if k > len(context):
                break
            ctx = context[len(context) - k:] if k else ()
            total = self.context_totals[k].get(ctx, 0)
            if total:  # an unseen context passes its weight on to the uniform floor
                p += self.weights[k + 1] * self.counts[k].get((ctx, token), 0) / total
                used += self.weights[k + 1]
        return p + (1.0 - used) / self.vocab_size

    def most_likely(self, context: Sequence[int]) -> int:
        """The id of highest prob(context, id) (greedy decoding). Only ids seen after some suffix
        of the context, or the most frequent one, can win: the uniform floor is the same for all."""
        if not hasattr(self, "_successors"):
            self._successors = [{} for _ in range(self.n)]
            for k in range(self.n):
                for ctx, tok in self.counts[k]:
                    self._successors[k].setdefault(ctx, set()).add(tok)
            self._top = max(self.counts[0], key=self.counts[0].get)[1] if self.counts[0] else 0
        context = tuple(context)[-(self.n - 1):] if self.n > 1 else ()
        candidates = {self._top}
        for k in range(1, min(self.n, len(context) + 1)):
            candidates |= self._successors[k].get(context[len(context) - k:], set())
        return max(sorted(candidates), key=lambda t: self.prob(context, t))

    def token_losses(self, stream: Sequence[int]) -> torch.Tensor:
        """-log P(stream[i] | stream[:i]) for i >= 1 (the first token has no context), float64."""
        stream = list(stream)
        nll = [-math.log(self.prob(stream[max(0, i - self.n + 1):i], stream[i])) for i in range(1, len(stream))]
        return torch.tensor(nll, dtype=torch.float64)
