"""camplib's GPT split over t tensor-parallel ranks, and the bridge to the dense model.

`TensorParallelGPT(cfg, group, sequence_parallel)` has the dense `camplib.model.GPT`'s structure
and parameter names, with the parallel layers of `camplib.parallel.tensor.layers` in place of the dense
ones: vocab-parallel embedding and LM head (tied or not), parallel attention and MLP. Its loss is
the vocab-parallel cross-entropy, so no rank holds the full logits.

`from_dense(gpt)` loads a dense model's weights into this rank's shards (`shard_layout` says how
each parameter is split), and `unshard` puts every rank's pieces back together: that is how the
tests prove the split model computes exactly what the dense one does. `TensorParallelBlock.from_dense`
does the same for one trained `camplib.model.Block`.
"""
from __future__ import annotations

import torch
from torch import nn

from camplib.model import GPT, Block, GPTConfig, make_norm
from camplib.parallel.tensor.layers import (
    ColumnParallelLinear,
    ParallelAttention,
    ParallelMLP,
    Shard,
    VocabParallelEmbedding,
    mark_sequence_parallel,
    padded_size,
    shard_of,
    split_evenly,
    sync_sequence_parallel_grads,
    vocab_parallel_cross_entropy,
)
from camplib.parallel.tensor.comm import gather_from_tp, tp_rank, tp_size
from camplib.rope import RotaryEmbedding

__all__ = ["TensorParallelBlock", "TensorParallelGPT", "check_tp_config", "load_dense_shards", "shard_layout"]


def check_tp_config(cfg: GPTConfig, t: int, *, sequence_parallel: bool = False, pad_vocab: bool = True,
                    seq_len: int | None = None) -> None:
    """Raise a ValueError naming the numbers if `cfg` cannot be split over t ranks (no
    communication: every rank raises the same error before any collective)."""
    split_evenly(cfg.n_head, t, "n_head")
    split_evenly(cfg.kv_heads, t, "n_kv_head")
    split_evenly(cfg.ff_dim, t, "d_ff")
    split_evenly(padded_size(cfg.vocab_size, t) if pad_vocab else cfg.vocab_size, t, "vocab_size")
    if sequence_parallel and seq_len is not None:
        split_evenly(seq_len, t, "sequence length")


def shard_layout(module: nn.Module) -> dict[str, Shard]:
    """How every parameter of the dense model is split in `module` (built from the parallel
    layers, with the dense model's parameter names), by name; Shard(None): held whole."""
    layout = {}
    for prefix, sub in module.named_modules():
        if hasattr(sub, "shard_specs"):
            for name, spec in sub.shard_specs().items():
                layout[f"{prefix}.{name}" if prefix else name] = spec
    return {name: layout.get(name, Shard(None)) for name, _ in module.named_parameters()}


@torch.no_grad()
def load_dense_shards(module: nn.Module, dense_params: dict[str, torch.Tensor], group=None) -> None:
    """Copy this rank's shard of every dense parameter (by name) into `module`'s parameters."""
    rank, t = tp_rank(group), tp_size(group)
    layout = shard_layout(module)
    missing = sorted(set(layout) - set(dense_params))
    if missing:
        raise KeyError(f"dense parameters missing: {missing}")
    params = dict(module.named_parameters())
    for name, spec in layout.items():
        params[name].copy_(shard_of(dense_params[name], spec, rank, t))


class TensorParallelBlock(nn.Module):
    """camplib.model.Block with parallel attention and MLP. Norms run on whatever the block holds:
    the full sequence, or with sequence parallelism this rank's shard of it."""

    def __init__(self, cfg: GPTConfig, rope: RotaryEmbedding | None, sequence_parallel: bool, group=None,
                 context=None):
        super().__init__()
        sp = {"sequence_parallel": sequence_parallel, "group": group}
        self.ln1 = make_norm(cfg)
        self.attn = ParallelAttention(cfg.d_model, cfg.n_head, cfg.kv_heads, bias=cfg.bias, rope=rope,
                                      dropout=cfg.dropout, context=context, **sp)
        self.ln2 = make_norm(cfg)
        self.mlp = ParallelMLP(cfg.d_model, cfg.ff_dim, cfg.mlp, bias=cfg.bias, gelu_approximate=cfg.gelu_approximate,
                               dropout=cfg.dropout, **sp)
        if sequence_parallel:
            mark_sequence_parallel(*self.ln1.parameters(), *self.ln2.parameters())

    @classmethod
    def from_dense(cls, block: Block, group=None, *, sequence_parallel: bool = False) -> TensorParallelBlock:
        """This rank's shards of a trained dense `camplib.model.Block` (same dtype and device): it
        computes what `block` computes, on the full sequence (B, T, d), or with `sequence_parallel`
        on this rank's shard of it (B, T/t, d), whose gradients then need `sync_sequence_parallel_grads`.
        Attention and MLP weights are split (Megatron's plan); norms are copied whole."""
        cfg = block.config
        rope = (RotaryEmbedding(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta, cfg.rope_pairing)
                if cfg.pos == "rope" else None)
        weight = next(block.parameters())
        model = cls(cfg, rope, sequence_parallel, group).to(device=weight.device, dtype=weight.dtype)
        load_dense_shards(model, dict(block.named_parameters()), group)
        return model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TensorParallelGPT(nn.Module):
    """This rank's part of GPT(cfg). forward(idx, targets) -> (logits, loss): logits are this
    rank's vocabulary columns (B, T, V_pad/t) (`full_logits` gathers them), loss the mean
    next-token cross-entropy, the same on every rank.

    With `sequence_parallel`, activations between the parallel layers are sequence shards
    (T must divide by t): call `sync_grads()` after backward to sum the gradients of the
    parameters used there (norms, position table, row biases).

    With `context` (a `camplib.parallel.context.ring.ContextShard` of the cp group), idx is this
    rank's shard of the sequence (`split_sequence`), positions follow its chunks, attention is
    ring attention over the group, and the loss is the mean over this rank's tokens.

    The training path only: no KV cache, attention_mask or generate (use the dense GPT)."""

    def __init__(self, cfg: GPTConfig, group=None, *, sequence_parallel: bool = False, pad_vocab: bool = True,
                 context=None):
        super().__init__()
        t = tp_size(group)
        check_tp_config(cfg, t, sequence_parallel=sequence_parallel, pad_vocab=pad_vocab)
        self.config, self.group, self.sequence_parallel, self.context = cfg, group, sequence_parallel, context
        sp = {"sequence_parallel": sequence_parallel, "group": group}
        self.tok_emb = VocabParallelEmbedding(cfg.vocab_size, cfg.d_model, pad_vocab=pad_vocab, **sp)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.pos == "learned" else None
        rope = (RotaryEmbedding(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta, cfg.rope_pairing)
                if cfg.pos == "rope" else None)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(TensorParallelBlock(cfg, rope, sequence_parallel, group, context)
                                    for _ in range(cfg.n_layer))
        self.ln_f = make_norm(cfg)
        self.lm_head = ColumnParallelLinear(cfg.d_model, self.tok_emb.padded_vocab, bias=False,
                                            dense_features=cfg.vocab_size, **sp)
        if cfg.tie_embeddings:  # both hold rows [start, start + V_pad/t) of the same table
            self.lm_head.weight = self.tok_emb.weight
        if sequence_parallel:
            mark_sequence_parallel(*self.ln_f.parameters(), *(self.pos_emb.parameters() if self.pos_emb else []))

    @classmethod
    def from_dense(cls, dense: GPT, group=None, *, sequence_parallel: bool = False,
                   pad_vocab: bool = True, context=None) -> TensorParallelGPT:
        """This rank's shards of `dense` (same dtype): computes what `dense` computes."""
        model = cls(dense.config, group, sequence_parallel=sequence_parallel, pad_vocab=pad_vocab, context=context)
        model.to(dense.tok_emb.weight.dtype)
        model.load_dense(dict(dense.named_parameters()))
        return model

    def shard_layout(self) -> dict[str, Shard]:
        """How every parameter of the dense model is split here, by name."""
        return shard_layout(self)

    def load_dense(self, dense_params: dict[str, torch.Tensor]) -> None:
        load_dense_shards(self, dense_params, self.group)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        T = idx.size(1)
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence of {T} tokens exceeds max_seq_len={self.config.max_seq_len}")
        if self.sequence_parallel:
            split_evenly(T, tp_size(self.group), "sequence length")
        x = self.tok_emb(idx)  # (B, T, d), or (B, T/t, d): this rank's sequence shard
        if self.pos_emb is not None:
            x = x + self.pos_emb(self.token_positions(T, idx.device))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V_pad/t)
        loss = None
        if targets is not None:
            loss = vocab_parallel_cross_entropy(logits, targets, self.tok_emb.vocab_start, self.config.vocab_size,
                                                self.group)
        return logits, loss

    def token_positions(self, T: int, device=None) -> torch.Tensor:
        """Global positions of the rows this rank holds after the embedding, for `T` input tokens:
        its context-parallel chunks (or 0..T-1), and with sequence parallelism its 1/t of them."""
        pos = self.context.positions(T, device) if self.context is not None else torch.arange(T, device=device)
        return pos.chunk(tp_size(self.group))[tp_rank(self.group)] if self.sequence_parallel else pos

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """All ranks' vocabulary columns, padding dropped: (B, T, vocab). For inspection only:
        this is the tensor tensor parallelism avoids building."""
        return gather_from_tp(logits, self.group)[..., :self.config.vocab_size]

    def sync_grads(self) -> int:
        """After backward with sequence parallelism: sum the sequence-parallel gradients. A torch
        optimizer's step() before it raises (camplib.parallel.tensor.layers.mark_sequence_parallel)."""
        return sync_sequence_parallel_grads(self, self.group) if self.sequence_parallel else 0
