"""camplib.quant.qlora on camplib's GPT: at initialisation the model equals the dequantized-NF4
model, only LoRA trains (and does learn), the base's quantized Linears take about 1/7 of their
fp32 bytes (measured from the storages), and a bad target or block size leaves the model unchanged."""
import copy

import pytest
import torch

from camplib.memory import storage_bytes
from camplib.model import GPT, GPTConfig
from camplib.quant.layers import QuantLinear
from camplib.quant.qlora import base_bytes, inject_qlora
from tests.support import assert_close

CFG = GPTConfig(vocab_size=64, n_layer=2, n_head=2, d_model=64, max_seq_len=32)


def test_qlora_starts_as_the_quantized_base_and_trains_only_the_adapters():
    torch.manual_seed(0)
    model = GPT(CFG)
    fp32 = copy.deepcopy(model)
    names = inject_qlora(model, ["qkv", "proj", "fc"], r=4, alpha=8)
    assert len(names) == 8                            # "proj" is attn.proj and mlp.proj
    ref = copy.deepcopy(fp32)                          # the same model with its targets' weights through NF4
    with torch.no_grad():
        for n in names:
            ref.get_submodule(n).weight.copy_(model.get_submodule(n).base.dequantized_weight())
    idx = torch.randint(0, 64, (2, 16))
    assert_close("QLoRA logits at initialisation (B = 0) vs the NF4-dequantized model", model(idx)[0], ref(idx)[0],
                 atol=1e-5, rtol=1e-5)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {f"{n}.lora_{ab}" for n in names for ab in "AB"}, sorted(trainable)
    params = [p for p in model.parameters() if p.requires_grad]
    data = torch.randint(0, 64, (4, 17))
    losses = []
    for _ in range(15):                                # plain SGD: the point is that gradients reach A and B
        _, loss = model(data[:, :-1], data[:, 1:])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= 0.5 * g
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


def test_base_memory_is_measured():
    torch.manual_seed(0)
    model = GPT(CFG)
    targets = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    fp32_target_bytes = storage_bytes(model.get_submodule(n).weight for n in targets)
    before = storage_bytes(list(model.parameters()) + list(model.buffers()))   # all of it, before freezing
    inject_qlora(model, ["qkv", "proj", "fc"], r=4, alpha=8)
    quant = [m for m in model.modules() if isinstance(m, QuantLinear)]
    nf4_bytes = sum(m.weight_bytes() for m in quant)
    assert 6.5 < fp32_target_bytes / nf4_bytes < 8, (fp32_target_bytes, nf4_bytes)
    counted = base_bytes(model)
    assert counted["base"] == before - fp32_target_bytes + nf4_bytes, (counted, before)
    assert counted["adapters"] == sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)


def test_bad_input_leaves_the_model_unchanged():
    model = GPT(CFG)
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="match no module"):
        inject_qlora(model, ["nothing_like_this"])
    with pytest.raises(ValueError, match="rank"):
        inject_qlora(model, ["qkv"], r=0)
    odd = GPT(GPTConfig(vocab_size=64, n_layer=1, n_head=2, d_model=36, max_seq_len=8))
    with pytest.raises(ValueError, match=r"not whole NF4 blocks of 64"):
        inject_qlora(odd, ["qkv"])
    assert not any(isinstance(m, QuantLinear) for m in model.modules())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
