"""autograder.checks: the messages students see must name the tensor and the max difference,
and a check must fail on anything but a match (NaN, shape, dtype, truthy non-bools)."""
import pytest
import torch

from autograder.checks import (
    check_close,
    check_equal,
    check_finite,
    check_shape,
    check_true,
    tolerance,
)


def test_close_passes_within_tolerance():
    x = torch.randn(4, 5)
    check_close("x", x + 1e-7, x)


def test_close_message_names_tensor_index_and_difference():
    expected = torch.zeros(3, 4)
    actual = expected.clone()
    actual[2, 1] = 0.5
    with pytest.raises(AssertionError) as info:
        check_close("attention output", actual, expected)
    msg = str(info.value)
    assert msg.startswith("attention output:")
    assert "max |difference| = 0.5" in msg and "(2, 1)" in msg and "1 of 12" in msg


@pytest.mark.parametrize("actual, expected, fragment", [
    (torch.zeros(2, 3), torch.zeros(3, 2), "shape (2, 3), expected (3, 2)"),
    (torch.zeros(2, dtype=torch.float64), torch.zeros(2), "dtype torch.float64"),
    (torch.tensor([float("nan"), 0.0]), torch.zeros(2), "NaN pattern differs"),
    (torch.tensor([float("inf")]), torch.tensor([1.0]), "max |difference| = inf"),
    (None, torch.zeros(2), "expected a tensor, got NoneType"),
])
def test_close_rejects(actual, expected, fragment):
    with pytest.raises(AssertionError) as info:
        check_close("t", actual, expected)
    assert fragment in str(info.value)


def test_close_accepts_matching_nan_and_inf():
    t = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    check_close("t", t.clone(), t)


def test_tolerances_are_stated_per_dtype():
    assert tolerance(torch.float64)[0] < tolerance(torch.float32)[0] < tolerance(torch.bfloat16)[0]
    assert tolerance(torch.int64) == (0.0, 0.0)


def test_equal_and_shape_and_finite():
    check_equal("mask", torch.ones(2, 2, dtype=torch.bool).tril(), torch.tensor([[True, False], [True, True]]))
    with pytest.raises(AssertionError, match="1 of 4 elements differ"):
        check_equal("mask", torch.ones(2, 2, dtype=torch.bool), torch.tensor([[True, False], [True, True]]))
    with pytest.raises(AssertionError, match="got 3, expected 3.0"):
        check_equal("n", 3, 3.0)
    with pytest.raises(AssertionError, match=r"shape \(2,\), expected \(3,\)"):
        check_shape("y", torch.zeros(2), (3,))
    with pytest.raises(AssertionError, match="1 non-finite"):
        check_finite("p", torch.tensor([0.0, float("nan")]))


def test_true_requires_a_real_true():
    check_true("ok", True)
    check_true("all", torch.tensor([True, True]))

    class Liar:
        def __bool__(self):
            return True

        def __eq__(self, other):
            return True

    for fake in (1, "yes", Liar()):
        with pytest.raises(AssertionError, match="fake: check failed"):
            check_true("fake", fake)
