"""Prefix tuning (Li & Liang 2021; P-tuning v2, Liu et al. 2021): freeze the whole model and
train, for every layer, a few "virtual tokens'" keys and values that every real token can attend
to. Nothing of the model changes; a task is a (layers x 2 x virtual tokens x d) tensor.

Built on camplib's GPT and its KV cache: the prefix is written into each layer's cache first, so
the real tokens see it exactly as they would see earlier tokens of the sequence, and they sit at
positions P..P+T-1 after it. `peft`'s `PrefixTuning` does the same through transformers'
`past_key_values` (an attention mask of ones prepended), and stores the prefix in the same layout,
(virtual tokens, layers * 2 * kv heads * head dim) without the reparametrisation MLP:
`prefix.weight` here is `prompt_encoder.default.embedding.weight` there, and with the same tensor
the logits are equal (tests/camplib/test_prompt_tuning.py).
"""
from __future__ import annotations

import torch
from torch import nn

from camplib.model import GPT

__all__ = ["PrefixTuning"]


class PrefixTuning(nn.Module):
    """Trainable per-layer key/value prefixes for a frozen camplib GPT (`model` is not a
    submodule: its parameters stay out of this module's, and out of its optimizer)."""

    def __init__(self, model: GPT, n_virtual: int, init_std: float = 1.0):
        super().__init__()
        if not isinstance(n_virtual, int) or n_virtual < 1:
            raise ValueError(f"n_virtual must be a positive integer, got {n_virtual!r}")
        cfg = model.config
        self.n_virtual, self.n_layer = n_virtual, cfg.n_layer
        self.n_kv_head, self.head_dim = cfg.kv_heads, cfg.head_dim
        w = model.tok_emb.weight
        # peft's nn.Embedding(num_virtual_tokens, layers * 2 * token_dim), N(0, 1) at the start
        self.prefix = nn.Embedding(n_virtual, cfg.n_layer * 2 * cfg.kv_heads * cfg.head_dim,
                                   dtype=w.dtype, device=w.device)
        nn.init.normal_(self.prefix.weight, std=init_std)
        self._model = [model]            # a list hides it from nn.Module registration
        for p in model.parameters():
            p.requires_grad_(False)

    @property
    def model(self) -> GPT:
        return self._model[0]

    def key_values(self, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values), each (batch, kv heads, n_virtual, head_dim): peft's layout,
        (P, L*2, H, D) permuted to (L*2, H, P, D), layer i's keys at 2i and values at 2i+1."""
        kv = self.prefix.weight.view(self.n_virtual, self.n_layer * 2, self.n_kv_head, self.head_dim)
        kv = kv.permute(1, 2, 0, 3)
        return [(kv[2 * i].expand(batch, -1, -1, -1), kv[2 * i + 1].expand(batch, -1, -1, -1))
                for i in range(self.n_layer)]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """(logits of the real tokens, loss or None), as GPT.forward, with the prefix in front."""
        B, T = idx.shape
        P = self.n_virtual
        if P + T > self.model.config.max_seq_len:
            raise ValueError(f"{P} virtual + {T} real tokens exceed max_seq_len={self.model.config.max_seq_len}")
        caches = self.model.new_caches(B, P + T)
        for cache, (k, v) in zip(caches, self.key_values(B)):
            cache.update(k, v)           # written in place: gradients reach the prefix through the copy
        return self.model(idx, targets, caches=caches)
