"""camplib.quant.formats: absmax and zero-point integers at every granularity, against the
formulas written out independently here (fp64), the error bound s/2 of round-to-nearest, and
torch's own quantize_per_tensor / quantize_per_channel; int4 packing's nibble order and bad input."""
import pytest
import torch

from camplib.quant.formats import (dequantize_absmax, dequantize_zero_point, grouped, pack_int4, quantize_absmax,
                                   quantize_zero_point, unpack_int4)
from tests.support import assert_close


def weight(rows=16, cols=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g)


@pytest.mark.parametrize("granularity", ["tensor", "channel", 16])
@pytest.mark.parametrize("bits", [8, 4])
def test_absmax_matches_the_formula_and_errs_at_most_half_a_step(granularity, bits):
    w = weight()
    q, scale = quantize_absmax(w, bits, granularity)
    qmax = 2 ** (bits - 1) - 1
    slices = w.double().reshape(1 if granularity == "tensor" else -1, w.numel() if granularity == "tensor" else
                                (w.shape[1] if granularity == "channel" else granularity))
    s = slices.abs().amax(1, keepdim=True) / qmax
    expected = torch.clamp(torch.round(slices / s), -qmax, qmax).reshape(w.shape)
    assert q.dtype == torch.int8
    assert_close(f"absmax codes, {bits} bits, {granularity}", q.double(), expected, atol=0, rtol=0)
    err = (dequantize_absmax(q, scale, granularity) - w).abs().reshape(slices.shape)
    assert bool((err <= scale / 2 * (1 + 1e-6)).all()), f"error above half a step: max {float((err - scale / 2).max()):.3g}"


@pytest.mark.parametrize("granularity", ["tensor", "channel", 16])
@pytest.mark.parametrize("bits", [8, 4])
def test_zero_point_maps_min_and_max_onto_the_grid(granularity, bits):
    w = weight(seed=1) + 0.3                                   # lopsided: zero-point's case
    q, scale, zero = quantize_zero_point(w, bits, granularity)
    assert q.dtype == torch.uint8 and int(q.max()) <= 2 ** bits - 1
    err = (dequantize_zero_point(q, scale, zero, granularity) - w).abs()
    # half a step, plus up to half a step more at the ends of the range (the zero point is rounded)
    assert bool((grouped(err, granularity) <= scale * (1 + 1e-6)).all()), f"max error {float(err.max()):.3g}"
    inside = grouped(err, granularity) <= scale * 0.5 * (1 + 1e-6)
    assert float(inside.float().mean()) > 0.95, f"only {float(inside.float().mean()):.2%} within half a step"
    assert_close("zero point is an integer code", zero, torch.round(zero), atol=0, rtol=0)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_int8_equals_torch_quantize_per_tensor_and_per_channel():
    w = weight(8, 32, seed=2)
    q, scale = quantize_absmax(w, 8, "tensor")
    ref = torch.quantize_per_tensor(w, float(scale), 0, torch.qint8)
    assert_close("per-tensor int8 vs torch.quantize_per_tensor", q, ref.int_repr(), atol=0, rtol=0)
    q, scale = quantize_absmax(w, 8, "channel")
    ref = torch.quantize_per_channel(w, scale.reshape(-1).double(), torch.zeros(8, dtype=torch.long), 0, torch.qint8)
    assert_close("per-channel int8 vs torch.quantize_per_channel", q, ref.int_repr(), atol=0, rtol=0)
    q, scale, zero = quantize_zero_point(w, 8, "tensor")
    ref = torch.quantize_per_tensor(w, float(scale), int(zero), torch.quint8)
    assert_close("zero-point uint8 vs torch.quantize_per_tensor(quint8)", q, ref.int_repr(), atol=0, rtol=0)


def test_a_calibrated_scale_clips_and_the_zero_point_is_added_before_clamping():
    x = torch.tensor([[-3.0, -1.0, 0.0, 0.5, 2.0, 9.0]])
    q, _, _ = quantize_zero_point(x, 8, "tensor", scale=torch.tensor([[0.01]]), zero=torch.tensor([[100.0]]))
    assert q.tolist() == [[0, 0, 100, 150, 255, 255]], q.tolist()
    q, _ = quantize_absmax(x, 8, "tensor", scale=torch.tensor([[0.02]]))
    assert q.tolist() == [[-127, -50, 0, 25, 100, 127]], q.tolist()


def test_packing_puts_the_first_code_in_the_high_nibble_and_round_trips():
    codes = torch.tensor([[1, 2, 15, 0], [7, 8, 3, 12]])
    packed = pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.tolist() == [[0x12, 0xF0], [0x78, 0x3C]], packed.tolist()
    assert unpack_int4(packed).tolist() == codes.tolist()
    big = torch.randint(0, 16, (5, 64), generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_int4(pack_int4(big)), big.to(torch.uint8))
    assert pack_int4(big).numel() * 2 == big.numel()


def test_bad_input_names_the_shape():
    with pytest.raises(ValueError, match=r"group_size 48 does not divide in_features 100 .*\(8, 100\)"):
        quantize_absmax(torch.randn(8, 100), 4, 48)
    with pytest.raises(ValueError, match=r"even last dimension.*\(3, 5\)"):
        pack_int4(torch.zeros(3, 5, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"\[0, 15\].*16"):
        pack_int4(torch.tensor([[3, 16]]))
    with pytest.raises(TypeError, match=r"floating-point.*torch.int64.*\(2, 2\)"):
        quantize_absmax(torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="integer codes"):
        pack_int4(torch.zeros(2, 2))
