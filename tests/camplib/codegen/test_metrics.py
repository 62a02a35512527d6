"""The metric formulas against their definitions: perplexity from torch's mean cross-entropy,
bits per byte, exact match on the first line (indentation counts, trailing space does not), parse rate."""
import math

import pytest
import torch
import torch.nn.functional as F

from camplib.codegen.metrics import bits_per_byte, first_line, next_line_exact_match, parse_rate, parses
from tests.support import assert_close


def f64(x: float) -> torch.Tensor:
    """A Python float as an fp64 tensor (assert_close would otherwise read it as fp32)."""
    return torch.tensor(x, dtype=torch.float64)


def test_perplexity_is_exp_of_the_mean_cross_entropy():
    from camplib.codegen.metrics import perplexity

    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(50, 7, generator=g, dtype=torch.float64), torch.randint(0, 7, (50,), generator=g)
    per_token = F.cross_entropy(logits, targets, reduction="none")
    assert_close("perplexity", f64(perplexity(per_token)), math.exp(F.cross_entropy(logits, targets).item()),
                 atol=0, rtol=1e-12)
    assert_close("uniform over 7 ids", f64(perplexity(torch.full((9,), math.log(7), dtype=torch.float64))), 7.0, atol=0, rtol=1e-12)
    with pytest.raises(ValueError):
        perplexity(torch.zeros(0))


def test_bits_per_byte():
    assert_close("8 bits for a uniform byte", f64(bits_per_byte(10 * math.log(256), 10)), 8.0, atol=0, rtol=1e-12)
    with pytest.raises(ValueError):
        bits_per_byte(1.0, 0)


def test_next_line_exact_match_rules():
    refs = ["    return x", "    return x", "    return x", "    return x"]
    preds = ["    return x  \nmore", "return x", "    return x\r\n", "    return y"]
    assert first_line("  a \t\nb") == "  a"
    assert next_line_exact_match(preds, refs) == 0.5   # trailing space/\r ignored; indentation counts
    with pytest.raises(ValueError):
        next_line_exact_match(["a"], [])


def test_parse_rate():
    assert parses("def f():\n    return 1\n") and not parses("def f(:\n") and not parses("x = '\0'")
    assert parse_rate(["x = 1", "x = (", "'\\d'"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        parse_rate([])
