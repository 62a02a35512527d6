"""camplib.quant.llm_int8 against bitsandbytes 0.50.2 on the CPU: the vector-wise codes, scales and
outlier columns equal int8_vectorwise_quant's (threshold 6.0), the mixed int8/float matmul equals
int8_mixed_scaled_mm, the weight codes equal Linear8bitLt's; the decomposition's error is far
below plain int8 when features carry outliers."""
import pytest
import torch
from torch import nn

from camplib.quant.llm_int8 import Int8OutlierLinear, llm_int8_matmul, vectorwise_int8
from tests.support import assert_close

bnb = pytest.importorskip("bitsandbytes")
pytestmark = pytest.mark.parity


def activations(tokens=24, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, d, generator=g)
    x[:, 3] *= 20                                          # two outlier features, in every token (as in LLMs)
    x[:, 40] -= 15
    return x


def test_vectorwise_codes_equal_bitsandbytes():
    x = activations()
    for threshold in (0.0, 6.0):
        codes, absmax, cols = vectorwise_int8(x, threshold)
        ref_codes, ref_absmax, ref_cols = bnb.functional.int8_vectorwise_quant(x.clone(), threshold=threshold)
        assert torch.equal(codes, ref_codes) and torch.equal(absmax, ref_absmax), threshold
        assert (cols is None and ref_cols is None) or torch.equal(cols, ref_cols), (cols, ref_cols)
    assert cols.tolist()[:2] == [3, 40]


def test_mixed_matmul_equals_bitsandbytes_and_beats_plain_int8():
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    x = activations()
    layer = Int8OutlierLinear(lin, threshold=6.0)
    ca, sca, cols = bnb.functional.int8_vectorwise_quant(x.clone(), threshold=6.0)
    ref, _ = torch.ops.bitsandbytes.int8_mixed_scaled_mm(x, ca, layer.weight_codes, sca, layer.weight_absmax, cols,
                                                         layer.bias)
    out = layer(x)
    # bitsandbytes rescales by the literal 6.200124e-05, not 1/127^2 = 6.2000124e-05 (1.8e-5 relative), and
    # the int8 and outlier parts nearly cancel in places: measured max |difference| 3.8e-5 on outputs of order 1
    assert_close("LLM.int8 output vs bitsandbytes' int8_mixed_scaled_mm", out, ref, atol=1e-4, rtol=5e-5)
    # the activations' share of the error: against a float matmul with the same int8 weight
    w = layer.weight_codes.float() * layer.weight_absmax[:, None] / 127
    exact = nn.functional.linear(x, w, layer.bias)
    plain = llm_int8_matmul(x, layer.weight_codes, layer.weight_absmax, threshold=float("inf"), bias=layer.bias)
    err_mixed, err_plain = float((out - exact).abs().max()), float((plain - exact).abs().max())
    assert err_mixed * 5 < err_plain, f"outlier decomposition error {err_mixed:.3g} vs plain int8 {err_plain:.3g}"


def test_weight_codes_equal_linear8bitlt():
    torch.manual_seed(1)
    lin = nn.Linear(64, 32).half()
    ref = bnb.nn.Linear8bitLt(64, 32, has_fp16_weights=False, threshold=6.0)
    ref.load_state_dict(lin.state_dict())
    ref = ref.to("cpu")
    x = activations().half()
    out = ref(x)                                           # on a CPU: dequantized int8 weight, one float matmul
    layer = Int8OutlierLinear(lin, threshold=6.0)
    assert torch.equal(layer.weight_codes, ref.state.CB) and torch.equal(layer.weight_absmax, ref.state.SCB)
    assert ref.state.threshold == 6.0
    w = (layer.weight_codes.float() * layer.weight_absmax[:, None] / 127).half()
    assert_close("Linear8bitLt on CPU = float matmul with the dequantized int8 weight", out,
                 nn.functional.linear(x, w, lin.bias), atol=1e-2, rtol=1e-3)


def test_bad_input():
    with pytest.raises(ValueError, match=r"64 input features, the weight is \(32, 48\)"):
        llm_int8_matmul(torch.randn(2, 64), torch.zeros(32, 48, dtype=torch.int8), torch.ones(32))
