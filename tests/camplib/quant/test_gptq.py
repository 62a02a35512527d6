"""camplib.quant.gptq: on one layer with correlated inputs, GPTQ's output error is well below
round-to-nearest's with the same quantizer; lazy batching (blocks) does not change the result;
with uncorrelated inputs there is nothing to compensate; bad shapes are named."""
import pytest
import torch

from camplib.quant.gptq import gptq_quantize, hessian, output_error, rtn_quantize
from tests.support import assert_close


def layer_and_inputs(d_in=256, d_out=64, n=1024, seed=0, correlated=True):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(d_out, d_in, generator=g) / d_in ** 0.5
    z = torch.randn(n, d_in, generator=g)
    mix = torch.randn(d_in, d_in, generator=g) / d_in ** 0.5 + torch.eye(d_in) if correlated else torch.eye(d_in)
    return w, z @ mix


@pytest.mark.parametrize("bits,group", [(4, 128), (3, 64)])
def test_gptq_beats_round_to_nearest_on_the_layer_output(bits, group):
    w, x = layer_and_inputs()
    h = hessian(x)
    e_gptq = output_error(gptq_quantize(w, h, bits, group), w, x)
    e_rtn = output_error(rtn_quantize(w, bits, group), w, x)
    assert e_gptq < 0.8 * e_rtn, f"{bits} bits, groups of {group}: GPTQ {e_gptq:.3g} vs RTN {e_rtn:.3g}"


def test_lazy_blocks_do_not_change_the_result():
    w, x = layer_and_inputs(d_in=128, d_out=16, n=512, seed=1)
    h = hessian(x)
    # groups start at block boundaries here, so both see the same weights when a group's scale is taken
    assert_close("GPTQ with blocks of 32 vs one column at a time", gptq_quantize(w, h, 4, 32, block=32),
                 gptq_quantize(w, h, 4, 32, block=1), atol=1e-6, rtol=0)


def test_values_lie_on_each_groups_grid():
    w, x = layer_and_inputs(d_in=64, d_out=8, n=256, seed=2)
    q = gptq_quantize(w, hessian(x), 4, 32)
    for row in range(8):
        for g0 in (0, 32):
            assert q[row, g0:g0 + 32].unique().numel() <= 16


def test_bad_input_names_the_shape():
    with pytest.raises(ValueError, match=r"group_size 48 does not divide in_features 100 .*\(8, 100\)"):
        gptq_quantize(torch.randn(8, 100), torch.eye(100), 4, 48)
    with pytest.raises(ValueError, match=r"\(64, 64\) for a weight of shape \(8, 64\), got \(32, 32\)"):
        gptq_quantize(torch.randn(8, 64), torch.eye(32), 4, 32)
