"""The n-gram baseline is a probability distribution (sums to 1 in every context, never 0) and
its losses are -log of those probabilities."""
import math

import pytest
import torch

from camplib.codegen.baselines import NgramModel
from tests.support import assert_close


def f64(x: float) -> torch.Tensor:
    """A Python float as an fp64 tensor (assert_close would otherwise read it as fp32)."""
    return torch.tensor(x, dtype=torch.float64)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_probabilities_sum_to_one_and_losses_match(n):
    g = torch.Generator().manual_seed(n)
    streams = [torch.randint(0, 6, (40,), generator=g).tolist() for _ in range(5)]
    model = NgramModel(n, vocab_size=8).fit(streams)
    for context in ([], [3], [3, 1], [7, 7]):   # seen, unseen (7 never occurs) contexts
        total = sum(model.prob(context, t) for t in range(8))
        assert_close(f"sum of P(. | {context})", f64(total), 1.0, atol=1e-12, rtol=0)
        assert min(model.prob(context, t) for t in range(8)) > 0
    s = streams[0]
    expected = torch.tensor([-math.log(model.prob(s[max(0, i - n + 1):i], s[i])) for i in range(1, len(s))],
                            dtype=torch.float64)
    assert_close("token_losses", model.token_losses(s), expected, atol=0, rtol=0)


def test_more_context_fits_training_text_better():
    text = [list(range(5)) * 30]
    losses = [NgramModel(n, 8).fit(text).token_losses(text[0]).mean().item() for n in (1, 2)]
    assert losses[1] < losses[0] - 0.5, losses


def test_bad_arguments():
    with pytest.raises(ValueError):
        NgramModel(0, 8)
    with pytest.raises(ValueError):
        NgramModel(2, 8, weights=[1.0, 1.0])
