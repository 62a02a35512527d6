"""camplib.quant.gptq on a whole (tiny, random) camplib GPT: each block's Linears get exactly the
per-layer GPTQ of the inputs that reach them through the already quantized earlier blocks; the
model's logits move less than with round-to-nearest; the model itself is left unchanged; a group
size that does not divide a layer names the layer and its shape."""
import copy

import pytest
import torch

from camplib.model import GPT, GPTConfig
from camplib.quant.gptq import (block_linears, gptq_quantize, hessian, output_error, quantize_model_gptq,
                                quantize_model_rtn, rtn_quantize)
from tests.support import assert_close


def tiny_gpt(style="llama", seed=0):
    torch.manual_seed(seed)
    make = GPTConfig.llama_style if style == "llama" else GPTConfig.gpt2_style
    return GPT(make(vocab_size=64, d_model=32, n_layer=2, n_head=4, max_seq_len=32)).eval()


def calibration(n=6, t=16, seed=1):
    return torch.randint(0, 64, (n, t), generator=torch.Generator().manual_seed(seed))


def layer_inputs(model, idx) -> dict[str, torch.Tensor]:
    """The input of every block Linear when `model` runs on idx, (tokens, in_features)."""
    seen, handles = {}, []

    def keep(name):
        def hook(_module, args):       # returns None: a pre-hook's return value would replace the input
            seen[name] = args[0].reshape(-1, args[0].shape[-1]).detach()
        return hook

    for name, lin in block_linears(model).items():
        handles.append(lin.register_forward_pre_hook(keep(name)))
    with torch.no_grad():
        model(idx)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("style", ["llama", "gpt2"])
def test_each_block_is_gptq_of_the_inputs_through_the_quantized_blocks_before_it(style):
    model, calib = tiny_gpt(style), calibration()
    q = quantize_model_gptq(model, calib, bits=4, group_size=16, batch_size=4)
    for b in range(len(model.blocks)):
        # block b of the original model, behind the quantized blocks 0..b-1
        hybrid = copy.deepcopy(model)
        for i in range(b):
            hybrid.blocks[i] = copy.deepcopy(q.blocks[i])
        xs = layer_inputs(hybrid, calib)
        for name, lin in block_linears(hybrid).items():
            if not name.startswith(f"blocks.{b}."):
                continue
            expected = gptq_quantize(lin.weight.detach(), hessian(xs[name]), 4, 16)
            # the same sums in a different order (batches of 4 sequences vs all at once): fp64
            # Hessians, so the weights agree to float32 rounding
            assert_close(f"{style}: {name} vs per-layer GPTQ of its inputs", q.get_submodule(name).weight.detach(),
                         expected, atol=1e-6, rtol=0)


def test_gptq_moves_outputs_less_than_round_to_nearest():
    model, calib = tiny_gpt(), calibration()
    gptq, rtn = quantize_model_gptq(model, calib, 4, 16), quantize_model_rtn(model, 4, 16)
    xs = layer_inputs(model, calib)
    originals = block_linears(model)
    for name, lin in originals.items():
        w = lin.weight.detach()
        e_gptq = output_error(gptq.get_submodule(name).weight.detach(), w, xs[name])
        e_rtn = output_error(rtn.get_submodule(name).weight.detach(), w, xs[name])
        # inputs from the *original* model here (GPTQ saw those of its quantized blocks): at most
        # RTN's error, layer by layer
        assert e_gptq <= e_rtn, f"{name}: GPTQ output error {e_gptq:.3g} > round-to-nearest {e_rtn:.3g}"
    with torch.no_grad():
        ref = model(calib)[0]
        d_gptq = float((gptq(calib)[0] - ref).pow(2).mean())
        d_rtn = float((rtn(calib)[0] - ref).pow(2).mean())
    assert d_gptq < 0.8 * d_rtn, f"logits MSE on the calibration data: GPTQ {d_gptq:.3g} vs RTN {d_rtn:.3g}"


def test_round_to_nearest_model_is_rtn_quantize_of_every_block_linear():
    model = tiny_gpt()
    q = quantize_model_rtn(model, 3, 8)
    for name, lin in block_linears(model).items():
        assert_close(name, q.get_submodule(name).weight.detach(), rtn_quantize(lin.weight.detach(), 3, 8),
                     atol=0, rtol=0)


def test_the_model_is_left_unchanged_and_only_block_linears_change():
    model = tiny_gpt().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for q in (quantize_model_rtn(model, 4, 16), quantize_model_gptq(model, calibration(), 4, 16)):
        assert q is not model and q.training, "a copy, in the model's training mode"
        assert_close("the original model's weights", model.state_dict(), before, atol=0, rtol=0)
        changed = {k for k, v in q.state_dict().items() if not torch.equal(v, before[k])}
        assert changed == {f"{n}.weight" for n in block_linears(model)}, sorted(changed)
    assert model.training


def test_a_group_that_does_not_divide_a_layer_names_it():
    model = tiny_gpt()       # in_features 32 (attention, gate, up) and 128 (down)
    for quantize in (lambda g: quantize_model_rtn(model, 4, g), lambda g: quantize_model_gptq(model, calibration(), 4, g)):
        with pytest.raises(ValueError, match=r"group_size 48 does not divide in_features 32 of blocks\.0\.attn\.qkv "
                                             r"\(weight of shape \(64, 32\)\)"):
            quantize(48)
