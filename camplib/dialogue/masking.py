"""Loss masking for chat fine-tuning: train on what the assistant writes, nothing else.

A conversation is one token sequence, but only some of its tokens are the model's to learn:
the assistant's content and the `<|im_end|>` that ends each assistant turn (without it the model
never learns to stop). The user's words, the role headers and the padding are context; training
on them teaches the model to imitate the user and to emit padding.

- `encode_chat` tokenizes a conversation as the template renders it, with a 0/1 mask of the
  assistant tokens (the same ids and mask as transformers' `apply_chat_template(...,
  return_assistant_tokens_mask=True)` with the project's template).
- `pad_batch` right-pads examples and writes labels: the token id where it is trained, -100
  elsewhere. The padding is found from the lengths, never from the padding *id*: with pad ==
  eos (SmolLM2, and the CI model) `labels[ids == pad_id] = -100` would also drop every real
  end-of-turn, and leaving the padding's labels in would train the model to pad.
- `masked_cross_entropy` shifts (position t predicts token t + 1, as transformers'
  causal-LM loss does) and averages -log p over the trained tokens of the whole batch.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from camplib.dialogue.template import IM_END, IM_START, check_messages
from camplib.losses import cross_entropy

__all__ = ["IGNORE", "encode_chat", "pad_batch", "masked_cross_entropy"]

IGNORE = -100   # the label of a position that is not trained (torch's and camplib's ignore_index)


def encode_chat(messages, encode: Callable[[str], list[int]]) -> tuple[list[int], list[int]]:
    """(input_ids, assistant_mask) of a conversation rendered with CHAT_TEMPLATE.

    Each message is encoded in three pieces, header / content + <|im_end|> / newline, so the
    mask is exact by construction; the special tokens split the text, so the pieces give the
    same ids as encoding the whole rendered text (tests/camplib/dialogue check it)."""
    check_messages(messages)
    ids, mask = [], []
    for m in messages:
        trained = m["role"] == "assistant"
        for piece, on in ((f"{IM_START}{m['role']}\n", False), (m["content"] + IM_END, trained), ("\n", False)):
            piece_ids = encode(piece)
            ids += piece_ids
            mask += [int(on)] * len(piece_ids)
    return ids, mask


def pad_batch(examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int,
              max_len: int | None = None) -> dict[str, torch.Tensor]:
    """Right-pad (input_ids, assistant_mask) pairs into {"input_ids", "attention_mask",
    "labels"} (B, T) long tensors; T = the longest example, cut to max_len."""
    if not examples:
        raise ValueError("pad_batch needs at least one example")
    for i, (ids, mask) in enumerate(examples):
        if len(ids) != len(mask):
            raise ValueError(f"example {i}: {len(ids)} ids but {len(mask)} mask entries")
    T = max(len(ids) for ids, _ in examples)
    T = min(T, max_len) if max_len is not None else T
    input_ids = torch.full((len(examples), T), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), T), dtype=torch.long)
    labels = torch.full((len(examples), T), IGNORE, dtype=torch.long)
    for b, (ids, mask) in enumerate(examples):
        n = min(len(ids), T)
        row = torch.tensor(list(ids[:n]), dtype=torch.long)
        input_ids[b, :n] = row
        attention[b, :n] = 1
        labels[b, :n] = torch.where(torch.tensor(list(mask[:n]), dtype=torch.bool), row, IGNORE)
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean -log p(token) over the trained positions: logits (B, T, V) of input_ids, labels
    (B, T) aligned with input_ids (IGNORE where not trained); logits[:, t] predicts labels[:, t + 1].
    NaN when nothing is trained (0/0, as torch's cross_entropy)."""
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"need logits (B, T, V) and labels (B, T), got {tuple(logits.shape)} and {tuple(labels.shape)}")
    shifted = logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32))
    return cross_entropy(shifted, labels[:, 1:], ignore_index=IGNORE)
