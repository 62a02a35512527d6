"""camplib.losses.cross_entropy against torch.nn.functional.cross_entropy, forward and backward.

Tolerances (|ours - torch| <= atol + rtol |torch|): fp64 atol 1e-12, rtol 1e-12; fp32 atol 1e-5,
rtol 1e-6 (the two sum exp() in a different order). With logits of size 1e4 the loss is ~1e4 and
fp32 keeps ~7 digits, so there the relative tolerance is what matters (2e-6).
"""
import pytest
import torch
import torch.nn.functional as F

from camplib.losses import cross_entropy, log_softmax
from tests.support import assert_close

TOL = {torch.float64: dict(atol=1e-12, rtol=1e-12), torch.float32: dict(atol=1e-5, rtol=1e-6)}
HUGE_TOL = dict(atol=1e-5, rtol=2e-6)


def both(logits, targets, **kw):
    """(loss, grad) of ours and of torch on copies of logits; the upstream gradient is random."""
    out = []
    for fn in (cross_entropy, F.cross_entropy):
        z = logits.detach().clone().requires_grad_(True)
        loss = fn(z, targets, **kw)
        g = torch.randn(loss.shape, dtype=loss.dtype, generator=torch.Generator().manual_seed(1))
        (loss * g).sum().backward()
        out.append((loss.detach(), z.grad))
    return out


CASES = [dict(), dict(reduction="sum"), dict(reduction="none"), dict(label_smoothing=0.1),
         dict(label_smoothing=0.3, reduction="none"), dict(ignore_index=3), dict(label_smoothing=1.0)]


@pytest.mark.parity
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kw", CASES, ids=[str(c) or "default" for c in CASES])
def test_equals_torch_forward_and_backward(dtype, kw):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 11, generator=g, dtype=dtype) * 3
    targets = torch.randint(0, 11, (37,), generator=g)
    targets[::5] = kw.get("ignore_index", -100)  # some ignored positions
    (loss, grad), (ref_loss, ref_grad) = both(logits, targets, **kw)
    assert_close(f"loss {kw} {dtype}", loss, ref_loss, **TOL[dtype])
    assert_close(f"d loss/d logits {kw} {dtype}", grad, ref_grad, **TOL[dtype])


@pytest.mark.parity
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_huge_logits_stay_finite_and_equal_torch(smoothing):
    logits = torch.tensor([[1e4, -1e4, 0.0, 5.0], [-1e4, -1e4, -1e4, -1e4], [1e4, 1e4, -1e4, 1e4],
                           [-1e4, 2.0, 1e4, 3.0]])
    targets = torch.tensor([1, 2, 0, 2])
    naive = -(logits.exp() / logits.exp().sum(-1, keepdim=True)).log().gather(1, targets[:, None])
    assert not torch.isfinite(naive).all()  # the textbook formula overflows here
    (loss, grad), (ref_loss, ref_grad) = both(logits, targets, label_smoothing=smoothing, reduction="none")
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all(), (loss, grad)
    assert_close(f"loss at +-1e4, smoothing {smoothing}", loss, ref_loss, **HUGE_TOL)
    assert_close(f"grad at +-1e4, smoothing {smoothing}", grad, ref_grad, **HUGE_TOL)


@pytest.mark.parity
def test_leading_dims_like_a_language_model():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 5, 7, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 7, (2, 5), generator=g)
    ours = cross_entropy(logits, targets, reduction="none")
    ref = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(2, 5)
    assert_close("per-position loss (B, T)", ours, ref, **TOL[torch.float64])


@pytest.mark.parametrize("reduction, expected", [("sum", 0.0), ("none", [0.0, 0.0, 0.0])])
def test_all_ignored_sum_and_none_are_zero(reduction, expected):
    logits = torch.randn(3, 4, requires_grad=True)
    loss = cross_entropy(logits, torch.full((3,), -100), reduction=reduction)
    loss.sum().backward()
    assert_close(f"all-ignored {reduction}", loss.detach(), torch.tensor(expected), atol=0, rtol=0)
    assert_close("their gradient", logits.grad, torch.zeros(3, 4), atol=0, rtol=0)


def test_all_ignored_mean_is_nan_like_torch_with_zero_gradient():
    (loss, grad), (ref_loss, ref_grad) = both(torch.randn(3, 4), torch.full((3,), -100))
    assert torch.isnan(loss) and torch.isnan(ref_loss), (loss, ref_loss)
    assert_close("gradient of an all-ignored mean", grad, ref_grad, atol=0, rtol=0)
    assert_close("it is zero", grad, torch.zeros(3, 4), atol=0, rtol=0)


def test_log_softmax_all_minus_inf_row_is_not_nan_in_other_rows():
    z = torch.tensor([[0.0, 1.0], [float("-inf"), float("-inf")]])
    out = log_softmax(z)
    assert_close("finite row", out[0], torch.log_softmax(z[0], -1), atol=1e-7, rtol=0)


@pytest.mark.parametrize("bad, error", [
    (dict(targets=torch.tensor([0, 9])), ValueError),                  # class out of range
    (dict(targets=torch.tensor([0, -1])), ValueError),                 # negative, not ignore_index
    (dict(targets=torch.tensor([0])), ValueError),                     # wrong shape
    (dict(targets=torch.tensor([0.0, 1.0])), TypeError),               # float targets
    (dict(reduction="avg"), ValueError),
    (dict(label_smoothing=1.5), ValueError),
    (dict(logits=torch.ones(2, 3, dtype=torch.long)), TypeError),
])
def test_bad_input_gives_a_clear_error(bad, error):
    kw = dict(logits=torch.randn(2, 3), targets=torch.tensor([0, 2]))
    kw.update(bad)
    with pytest.raises(error):
        cross_entropy(kw.pop("logits"), kw.pop("targets"), **kw)
