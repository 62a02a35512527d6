"""camplib.gguf.llama: a Llama-family .gguf as a camplib GPT and a tokenizer.

Small files are written here the way llama.cpp's converter writes them (tensor names, q/k rows
permuted into RoPE's interleaved pairing, byte-level BPE vocabulary) from a random
transformers LlamaForCausalLM. References: the original model's weights (fp32 files: bit for
bit), transformers' own GGUF loader (quantized files: bit for bit) and its GGUF tokenizer.
The real SmolLM2-135M-Instruct file is compared with transformers' loader in one slow test.
"""
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from camplib.gguf import config_from_gguf, load_gguf_llama, read_gguf, smollm2_path, tokenizer_from_gguf
from camplib.hf import from_hf
from tests.support import assert_close

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.parity
T = gguf.GGMLQuantizationType
TEXTS = ["def f(x):\n    return x + y  # hello", "  Indented\tTabs and ünïcödé ✓", "<|im_start|>user\nhi<|im_end|>"]


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: half-split rows -> interleaved, per head."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tiny_vocab():
    """A byte-level BPE: the 256 byte symbols, a few merges, control tokens at the front."""
    alphabet = list(bytes_to_unicode().values())
    merges = ["Ġ t", "e r", "Ġt h", "i n", "r e", "Ġ a", "Ġth e", "o n", "Ġ Ġ", "ĠĠ ĠĠ", "2 0"]   # "20": digit runs
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet + [m.replace(" ", "") for m in merges]
    return tokens, merges


def write_llama_gguf(path, hf: LlamaForCausalLM, quantized: bool, pre: str = "gpt2"):
    c = hf.config
    tokens, merges = tiny_vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_eos_token_id(2)
    w.add_bos_token_id(1)
    w.add_pad_token_id(2)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}")
    sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not c.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    for i in range(c.num_hidden_layers):
        for a, b in [("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"),
                     ("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                     ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
                     ("mlp.down_proj", "ffn_down")]:
            names[f"model.layers.{i}.{a}.weight"] = f"blk.{i}.{b}.weight"
    for hf_name, name in names.items():
        x = sd[hf_name]
        if name.endswith("attn_q.weight"):
            x = llama_cpp_permute(x, c.num_attention_heads)
        elif name.endswith("attn_k.weight"):
            x = llama_cpp_permute(x, c.num_key_value_heads)
        kind = None
        if quantized and x.ndim == 2:
            kind = T.Q8_0 if name == "token_embd.weight" else T.Q4_1
        if kind is None:
            w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
        else:
            raw = gguf.quants.quantize(np.ascontiguousarray(x, dtype=np.float32), kind)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_llama(tied: bool, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tiny_vocab()[0]), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rope_theta=5e4,
                      rms_norm_eps=1e-5, tie_word_embeddings=tied, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():   # norms away from 1, so a swapped norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    out = {}
    for tied in (True, False):
        for quantized in (False, True):
            hf = random_llama(tied)
            path = tmp_path_factory.mktemp("gguf") / f"tiny-{'tied' if tied else 'untied'}-{'q' if quantized else 'f32'}.gguf"
            write_llama_gguf(path, hf, quantized)
            out[tied, quantized] = (path, hf)
    return out


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_fp32_file_gives_the_original_weights_bit_for_bit(files, tied):
    path, hf = files[tied, False]
    ours = load_gguf_llama(path)
    want = from_hf(hf).state_dict()
    got = ours.state_dict()
    assert set(got) == set(want)
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name}: max |diff| {(got[name] - want[name]).abs().max():.3g}"
    assert ours.config.tie_embeddings == tied and ours.config.rope_theta == 5e4


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_quantized_file_equals_transformers_gguf_loader_bit_for_bit(files, tied):
    from transformers import AutoModelForCausalLM

    path, hf = files[tied, True]
    want = from_hf(AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)).state_dict()
    got = load_gguf_llama(path).state_dict()
    for name in want:
        assert torch.equal(got[name], want[name]), f"{name}: max |diff| {(got[name] - want[name]).abs().max():.3g}"
    ids = torch.randint(0, hf.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        err = (load_gguf_llama(path)(ids)[0] - hf(ids).logits).abs().max().item()
    assert 0 < err < 0.5, f"4-bit logits vs the fp32 model: max |diff| {err:.3g}"


def test_interleaved_pairing_keeps_the_files_rows_and_computes_the_same(files):
    path, _ = files[False, False]
    half, inter = load_gguf_llama(path), load_gguf_llama(path, pairing="interleaved")
    assert inter.config.rope_pairing == "interleaved"
    q_rows = inter.config.n_head * inter.config.head_dim
    raw_q = read_gguf(path).tensor("blk.0.attn_q.weight")
    assert torch.equal(inter.state_dict()["blocks.0.attn.qkv.weight"][:q_rows], raw_q)
    ids = torch.randint(0, half.config.vocab_size, (2, 50), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert_close("logits, interleaved vs half pairing", inter(ids)[0], half(ids)[0], atol=1e-5, rtol=1e-5)


def test_tokenizer_equals_transformers_gguf_tokenizer(files):
    from transformers import AutoTokenizer

    path, _ = files[True, False]
    ours, ref = tokenizer_from_gguf(path), AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in TEXTS:
        assert ours.encode(text) == ref.encode(text), text
        assert ours.decode(ours.encode(text)) == text
    assert ours.eos_token == "<|im_end|>" and ours.pad_token == "<|im_end|>" and ours.bos_token == "<|im_start|>"
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "there"}]
    assert ours.apply_chat_template(msgs, tokenize=False) == ref.apply_chat_template(msgs, tokenize=False)


def test_smollm_pre_tokenizer_splits_every_digit(tmp_path):
    path = tmp_path / "smollm.gguf"
    write_llama_gguf(path, random_llama(True), False, pre="smollm")
    tok = tokenizer_from_gguf(path)
    pieces = tok.convert_ids_to_tokens(tok.encode("x = 2024"))
    assert pieces[-4:] == ["2", "0", "2", "4"], pieces


def test_bad_files_are_refused_with_the_reason(tmp_path):
    path = tmp_path / "gpt2arch.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="architecture 'gpt2' is not supported"):
        config_from_gguf(path)


@pytest.mark.slow
def test_smollm2_equals_transformers_load_and_answers():
    """The real SmolLM2-135M-Instruct: every weight equal to transformers' GGUF loader bit for bit,
    the tokenizer equal to its GGUF tokenizer on standard-library text, and a greedy chat answer."""
    import inspect

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from camplib.generate import generate

    path = smollm2_path()
    f = read_gguf(path)
    ours = load_gguf_llama(f)
    ref = from_hf(AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name))
    want = ref.state_dict()
    for name, got in ours.state_dict().items():
        assert torch.equal(got, want[name]), f"{name}: max |diff| {(got - want[name]).abs().max():.3g}"
    tok, ref_tok = tokenizer_from_gguf(f), AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    # digits aside: the file's "smollm" split keeps each digit alone, transformers' loader does not
    text = "".join(c for c in inspect.getsource(inspect) if not c.isdigit())
    assert tok.encode(text) == ref_tok.encode(text)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        ref_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    prompt = torch.tensor([tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]])
    out = generate(ours, prompt, 16, eos_id=tok.eos_token_id)
    answer = tok.decode(out[0, prompt.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer
