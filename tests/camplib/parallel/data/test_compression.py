"""camplib.parallel.data.compression: quantized all-reduce within its stated error bound and byte
budget, top-k with error feedback loses nothing over time, and training still works."""
import pytest
import torch

from camplib.dist import launch
from camplib.dist.counting import count_bytes
from camplib.dist.ring import ring_all_reduce
from camplib.parallel.data.compression import (
    compressed_all_reduce,
    dequantize_int8,
    quantize_int8,
    sparse_all_reduce,
    topk_error_feedback,
)
from camplib.parallel.data.compression_run import compression_loss_curves


def test_int8_absmax_round_trip_error_is_at_most_half_a_step():
    x = torch.randn(4 * 256, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 2, 4).repeat_interleave(256)
    q, scales = quantize_int8(x)
    assert q.dtype == torch.int8 and scales.shape == (4,)
    err = (dequantize_int8(q, scales) - x).abs().reshape(4, 256)
    assert (err <= scales[:, None] / 2 * (1 + 1e-6)).all()
    torch.testing.assert_close(dequantize_int8(*quantize_int8(torch.zeros(256))), torch.zeros(256))


def _reduce_rank(rank, world_size, inputs, method):
    tensor = inputs[rank].clone()
    with count_bytes() as c:
        compressed_all_reduce(tensor, method, block=256)
    plain = inputs[rank].clone()
    with count_bytes() as c_plain:
        ring_all_reduce(plain)
    return {"out": tensor, "sent": c.sent, "plain_sent": c_plain.sent}


@pytest.mark.parity
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("method", ["fp16", "int8"])
def test_compressed_all_reduce_within_the_stated_bound_and_bytes(method, world_size):
    """Bound: N * sum_r max|x_r| / 254 (int8), N * sum_r max|x_r| * 2^-11 (fp16); every rank
    gets the same tensor; bytes: 1/2 (fp16) or 1/4 + scales (int8) of the fp32 ring's."""
    g = torch.Generator().manual_seed(world_size)
    numel = 3000   # not a multiple of the block: padding is part of the test
    inputs = [torch.randn(numel, generator=g) * (r + 1) for r in range(world_size)]
    outs = launch(_reduce_rank, world_size, inputs, method)
    exact = torch.stack(inputs).sum(0)
    spread = sum(x.abs().max().item() for x in inputs)
    bound = world_size * spread * (1 / 254 if method == "int8" else 2.0 ** -11) * 1.01
    for r, o in enumerate(outs):
        err = (o["out"] - exact).abs().max().item()
        assert err <= bound, f"{method} N={world_size} rank {r}: max error {err:.3g} > bound {bound:.3g}"
        assert torch.equal(o["out"], outs[0]["out"]), "ranks disagree"
    multiple = world_size * 256 if method == "int8" else world_size
    padded = -(-numel // multiple) * multiple
    per_value = 2 if method == "fp16" else 1 + 4 / 256
    assert outs[0]["sent"] == 2 * (world_size - 1) * padded // world_size * per_value
    assert outs[0]["sent"] / outs[0]["plain_sent"] < (0.51 if method == "fp16" else 0.27)


def test_topk_error_feedback_sends_everything_eventually():
    """Invariant: sum(sent) + residual == sum(grads) at every step. Bound: ||residual||_1 <=
    (d/k - 1) * max_t ||g_t||_1 (each step sends the k largest of d, at least k/d of the mass)."""
    g = torch.Generator().manual_seed(0)
    d, k, steps = 200, 10, 300
    mean = torch.randn(d, generator=g)
    residual, sent_sum, grad_sum, max_l1 = torch.zeros(d, dtype=torch.float64), 0, 0, 0.0
    for t in range(steps):
        grad = (mean + torch.randn(d, generator=g)).double()
        update, residual = topk_error_feedback(grad, residual, k)
        assert int((update != 0).sum()) <= k
        sent_sum, grad_sum = sent_sum + update, grad_sum + grad
        max_l1 = max(max_l1, grad.abs().sum().item())
        torch.testing.assert_close(sent_sum + residual, grad_sum, atol=1e-9, rtol=1e-12)
        assert residual.abs().sum().item() <= (d / k - 1) * max_l1 * (1 + 1e-9)
    relative = (sent_sum - grad_sum).norm() / grad_sum.norm()
    assert relative < 0.05, f"sum of sent updates is {relative:.3f} away from the sum of gradients"


def _sparse_rank(rank, world_size, updates, k):
    with count_bytes() as c:
        out = sparse_all_reduce(updates[rank], k)
    return {"out": out, "sent": c.sent}


@pytest.mark.parity
def test_sparse_all_reduce_sums_the_sparse_updates_sending_only_pairs():
    g = torch.Generator().manual_seed(1)
    updates = [topk_error_feedback(torch.randn(500, generator=g), torch.zeros(500), 20)[0] for _ in range(2)]
    outs = launch(_sparse_rank, 2, updates, 20)
    for o in outs:
        torch.testing.assert_close(o["out"], updates[0] + updates[1], atol=0, rtol=0)
        assert o["sent"] == 20 * (4 + 4)


def test_loss_curves_with_each_method():
    out = compression_loss_curves(2, [32, 64, 32], steps=8, batch=16, lr=0.05, block=64)
    sent, losses = out["bytes_per_step"], out["losses"]   # int8: 1 byte + 4/64 for the scale, padded blocks
    assert sent["fp16"] == sent["none"] / 2 and sent["int8"] < sent["none"] * 0.28 and sent["topk"] < sent["int8"]
    for method in ("fp16", "int8"):   # the quantization error barely changes the curve
        torch.testing.assert_close(torch.tensor(losses[method]), torch.tensor(losses["none"]), atol=1e-3, rtol=1e-2)
    assert losses["topk"][-1] < losses["topk"][0]


def test_int8_saves_70_percent_at_equal_heldout_loss_and_error_feedback_matters():
    """The brief's "gradient quantization cuts communication by 70%": int8 (blocks of 256) sends
    >= 70% fewer bytes than fp32, counted on the collectives, at a held-out loss within 1%
    (relative; measured 1e-5); top-k without error feedback ends worse than with it (measured
    +45% held-out loss at 40 steps) for the same bytes. ~2 s."""
    out = compression_loss_curves(2, [32, 256, 32], steps=40, batch=32, lr=0.1, block=256,
                                  methods=("none", "int8", "topk", "topk_noef"))
    sent, held = out["bytes_per_step"], out["heldout"]
    assert 1 - sent["int8"] / sent["none"] >= 0.70, sent
    assert abs(held["int8"] / held["none"] - 1) <= 0.01, held
    assert sent["topk_noef"] == sent["topk"], sent
    assert held["topk_noef"] > 1.1 * held["topk"], held
