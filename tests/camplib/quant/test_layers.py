"""camplib.quant.layers: weight-only quantized Linear layers: what they store (bytes counted from
the storages), outputs equal to a matmul with the dequantized weight, the error each scheme makes
on a real model (MiniLM's fp32 weights: sentence embeddings against fp32), and bad input."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from camplib.memory import storage_bytes
from camplib.model import GPT, GPTConfig
from camplib.quant.layers import QuantLinear, quantize_model
from camplib.quant.nf4 import dequantize_nf4, quantize_nf4
from tests.support import assert_close


def linear(d_in=256, d_out=128, seed=0, bias=True):
    torch.manual_seed(seed)
    return nn.Linear(d_in, d_out, bias=bias)


@pytest.mark.parametrize("scheme,ratio", [("int8", 4), ("int4", 8), ("nf4", 8)])
def test_bytes_are_4x_and_8x_smaller_than_fp32_plus_the_scales(scheme, ratio):
    lin = linear()
    layer = QuantLinear(lin, scheme)
    fp32 = storage_bytes([lin.weight])
    scales = {"int8": 128 * 4, "int4": 128 * 2 * (4 + 1), "nf4": 128 * 256 // 64 * 4}[scheme]
    assert layer.weight_bytes() == fp32 // ratio + scales, (scheme, layer.weight_bytes(), fp32 // ratio, scales)


@pytest.mark.parametrize("scheme,rel", [("int8", 0.01), ("int4", 0.15), ("nf4", 0.12)])
def test_forward_is_a_matmul_with_the_dequantized_weight(scheme, rel):
    lin = linear(seed=1)
    layer = QuantLinear(lin, scheme)
    x = torch.randn(4, 7, 256)
    w = layer.dequantized_weight()
    assert_close(f"{scheme} forward", layer(x), F.linear(x, w, lin.bias), atol=1e-5, rtol=1e-5)
    err = float((w - lin.weight.detach()).norm() / lin.weight.detach().norm())
    assert err < rel, f"{scheme}: relative weight error {err:.3f} >= {rel}"
    assert layer(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_nf4_layer_stores_what_quantize_nf4_gives():
    lin = linear(seed=2)
    for dq in (False, True):
        layer = QuantLinear(lin, "nf4", double_quant=dq)
        assert torch.equal(layer.dequantized_weight(), dequantize_nf4(quantize_nf4(lin.weight.detach(), 64, dq)))


def test_quantize_model_on_camplib_gpt_keeps_logits_close():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, max_seq_len=16, n_layer=2, n_head=2, d_model=64)
    model = GPT(cfg).eval()
    idx = torch.randint(0, 64, (2, 16))
    ref = model(idx)[0]
    names = quantize_model(model, "int8")
    assert names and all(isinstance(model.get_submodule(n), QuantLinear) for n in names)
    out = model(idx)[0]
    assert_close("GPT logits int8 vs fp32", out, ref, atol=0.05, rtol=0)


def test_bad_input_leaves_the_model_unchanged():
    with pytest.raises(ValueError, match=r"group_size 48 does not divide in_features 100 .*\(8, 100\)"):
        QuantLinear(nn.Linear(100, 8), "int4", group_size=48)
    with pytest.raises(ValueError, match=r"even in_features.*\(8, 5\)"):
        QuantLinear(nn.Linear(5, 8), "int4", group_size=5)
    with pytest.raises(ValueError, match="scheme"):
        QuantLinear(nn.Linear(4, 4), "int3")
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 8))
    before = [type(m) for m in model]
    with pytest.raises(ValueError, match="does not divide in_features 100"):
        quantize_model(model, "int4", group_size=64)
    assert [type(m) for m in model] == before, "a failed quantize_model must change nothing"
