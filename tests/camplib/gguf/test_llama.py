"""camplib.gguf.llama: a Llama-family .gguf as a camplib GPT and a tokenizer.

Small files are written (tests/camplib/gguf/tiny_files.py) the way llama.cpp's converter writes them (tensor names, q/k rows
permuted into RoPE's interleaved pairing, byte-level BPE vocabulary) from a random
transformers LlamaForCausalLM. References: the original model's weights (fp32 files: bit for
bit), transformers' own GGUF loader (quantized files: bit for bit) and its GGUF tokenizer.
The real SmolLM2-135M-Instruct file is compared with transformers' loader in one slow test.
"""
import pytest
import torch

from camplib.gguf import config_from_gguf, load_gguf_llama, read_gguf, smollm2_path, tokenizer_from_gguf
from camplib.hf import from_hf
from tests.support import assert_close

gguf = pytest.importorskip("gguf")
from tests.camplib.gguf.tiny_files import random_llama, write_llama_gguf  # noqa: E402

pytestmark = pytest.mark.parity
TEXTS = ["def f(x):\n    return x + y  # hello", "  Indented\tTabs and ünïcödé ✓", "<|im_start|>user\nhi<|im_end|>"]


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
