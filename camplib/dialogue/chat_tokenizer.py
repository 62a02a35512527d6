"""One tokenizer interface for p02, whatever the base model: camplib's byte-level BPE (the CI
model) or a `transformers` tokenizer (SmolLM2), each with the project's chat template.

`ChatTokenizer` gives what the project needs and nothing more: `encode(text)` (special-token
strings become their ids, no BOS added), `decode(ids)`, the end-of-turn id, the padding id, and
`hf`, a `transformers` tokenizer carrying CHAT_TEMPLATE, so `apply_chat_template` can be
compared with the project's own rendering and masks. The padding id is the end-of-turn id, as in
SmolLM2 (pad == eos == <|im_end|>): the case where "ignore the padding" by id also throws away
every end-of-turn the model must learn.

`hf_from_bpe` converts a camplib ByteBPE into a `tokenizers` byte-level BPE with the same ids
(bytes shown through GPT-2's byte-to-unicode map, merges in their learned order, special tokens
after them), wrapped as a PreTrainedTokenizerFast: the same text gives the same ids in both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from camplib.dialogue.template import CHAT_TEMPLATE, IM_END, SPECIAL_TOKENS
from camplib.tokenizer import ByteBPE, bytes_to_unicode

__all__ = ["ChatTokenizer", "hf_from_bpe", "from_bpe", "from_hf"]


@dataclass
class ChatTokenizer:
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    eot_id: int                 # <|im_end|>: ends an assistant turn, and generation
    pad_id: int                 # == eot_id here, on purpose (SmolLM2 does the same)
    vocab_size: int
    make_hf: Callable[[], object] = field(repr=False, default=None)

    @cached_property
    def hf(self):
        """The transformers tokenizer with CHAT_TEMPLATE (built on first use: importing
        transformers costs seconds that encoding alone does not need)."""
        return self.make_hf()


def hf_from_bpe(bpe: ByteBPE):
    """A transformers PreTrainedTokenizerFast giving the same ids as `bpe`, with CHAT_TEMPLATE."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if bpe.pattern != ByteBPE([]).pattern:
        raise ValueError("only GPT-2's pre-tokenizer pattern converts to tokenizers' ByteLevel")
    show = bytes_to_unicode()
    as_text = lambda b: "".join(show[x] for x in b)  # noqa: E731
    vocab = {}
    for i, piece in enumerate(bpe.vocab):
        key = as_text(piece)
        if key in vocab:  # two merge paths to the same bytes: tokenizers cannot hold both ids
            raise ValueError(f"token {i} repeats the bytes of token {vocab[key]} ({piece!r})")
        vocab[key] = i
    merges = [(as_text(bpe.vocab[a]), as_text(bpe.vocab[b])) for a, b in bpe.merges]
    tk = Tokenizer(models.BPE(vocab, merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in bpe.special_tokens])
    for s, i in bpe.special_tokens.items():
        if tk.token_to_id(s) != i:
            raise ValueError(f"special token {s!r} got id {tk.token_to_id(s)} in tokenizers, {i} in camplib")
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=IM_END, pad_token=IM_END)
    hf.chat_template = CHAT_TEMPLATE
    return hf


def from_bpe(bpe: ByteBPE) -> ChatTokenizer:
    missing = [s for s in SPECIAL_TOKENS if s not in bpe.special_tokens]
    if missing:
        raise ValueError(f"the tokenizer lacks the chat special tokens {missing}")
    eot = bpe.special_tokens[IM_END]
    return ChatTokenizer(encode=bpe.encode, decode=bpe.decode, eot_id=eot, pad_id=eot,
                         vocab_size=bpe.vocab_size, make_hf=lambda: hf_from_bpe(bpe))


def from_hf(tok) -> ChatTokenizer:
    """A transformers tokenizer (SmolLM2's) with the project's template instead of its own."""
    eot = tok.convert_tokens_to_ids(IM_END)
    if eot is None or eot == tok.unk_token_id:
        raise ValueError(f"{type(tok).__name__} has no {IM_END} token: not a ChatML tokenizer")
    tok.chat_template = CHAT_TEMPLATE
    return ChatTokenizer(encode=lambda t: tok.encode(t, add_special_tokens=False),
                         decode=lambda ids: tok.decode(ids), eot_id=eot, pad_id=eot,
                         vocab_size=len(tok), make_hf=lambda: tok)
