"""Making a trained sentence encoder (MiniLM, a BERT) physically smaller, piece by piece, for the
compression flow of lab a08 (`camplib.compress.intent_flow`).

MiniLM-L6's 22.7M parameters are half vocabulary: 30522 x 384 word embeddings (11.7M). A task
that reads a few hundred distinct tokens needs a few hundred rows: `RemappedTokenizer` maps the
tokenizer's ids onto the kept rows (every other id onto [UNK]'s row). The transformer layers
shrink by whole units, as in `camplib.compress.pruning` for the course's GPT: attention heads
(head_dim rows of query, key and value, head_dim input columns of the output projection) and MLP
channels (a row of `intermediate.dense`, an input column of `output.dense`). Nothing here imports
the modules lab a08 forbids (`pruning`, `distill`); the score and the vocabulary come in as
functions (the student's).

Bytes are measured, not computed: `serialized_bytes` writes the state dict with safetensors, as a
deployed model would be shipped, and counts the bytes written.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from safetensors.torch import save as safetensors_bytes
from torch import nn

from camplib.compress.slicing import sliced_linear
from camplib.quant.formats import quantize_absmax

__all__ = ["RemappedTokenizer", "used_token_ids", "prune_encoder_layer", "encoder_unit_scores", "keep_highest",
           "Int8Embedding", "serialized_bytes", "weight_count"]


class RemappedTokenizer:
    """A Hugging Face tokenizer whose input ids go through `remap` (old id -> row of the smaller
    embedding). Called like the tokenizer; everything else it returns is unchanged."""

    def __init__(self, tokenizer, remap: torch.Tensor):
        self.tokenizer, self.remap = tokenizer, remap.long().cpu()

    def __call__(self, texts, **kwargs):
        batch = self.tokenizer(texts, **kwargs)
        batch["input_ids"] = self.remap[batch["input_ids"]]
        return batch


def used_token_ids(tokenizer, texts: list[str], max_length: int = 48) -> torch.Tensor:
    """The distinct token ids `tokenizer` gives `texts` (as the classifier tokenizes them: special
    tokens, truncation), plus the padding id: what a model reading only these texts ever looks up."""
    ids = tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    seen = {int(i) for row in ids for i in row} | {int(tokenizer.pad_token_id)}
    return torch.tensor(sorted(seen), dtype=torch.long)


def prune_encoder_layer(layer: nn.Module, keep_heads, keep_channels) -> None:
    """Keep only the attention heads and MLP channels listed, in a transformers BertLayer, in place
    (fresh, smaller Linear layers). BERT's self-attention infers the head count from the query's
    width and keeps head_dim, so no config changes."""
    self_attn, out = layer.attention.self, layer.attention.output
    D = self_attn.attention_head_size
    heads = self_attn.query.out_features // D
    keep_heads = sorted(int(h) for h in keep_heads)
    keep_channels = sorted(int(c) for c in keep_channels)
    n_channels = layer.intermediate.dense.out_features
    if not keep_heads or len(set(keep_heads)) != len(keep_heads) or keep_heads[0] < 0 or keep_heads[-1] >= heads:
        raise ValueError(f"keep_heads={keep_heads}: need distinct head indices in [0, {heads})")
    if not keep_channels or len(set(keep_channels)) != len(keep_channels) or keep_channels[0] < 0 \
            or keep_channels[-1] >= n_channels:
        raise ValueError(f"keep_channels: need distinct channel indices in [0, {n_channels}), got {len(keep_channels)}")
    rows = [h * D + d for h in keep_heads for d in range(D)]
    for name in ("query", "key", "value"):
        setattr(self_attn, name, sliced_linear(getattr(self_attn, name), rows=rows, requires_grad=True))
    out.dense = sliced_linear(out.dense, cols=rows, requires_grad=True)
    if hasattr(self_attn, "num_attention_heads"):
        self_attn.num_attention_heads = len(keep_heads)
        self_attn.all_head_size = len(rows)
    layer.intermediate.dense = sliced_linear(layer.intermediate.dense, rows=keep_channels, requires_grad=True)
    layer.output.dense = sliced_linear(layer.output.dense, cols=keep_channels, requires_grad=True)


def encoder_unit_scores(clf: nn.Module, texts: list[str], labels, importance_fn, batch_size: int = 64,
                        loss_fn=None) -> dict[str, list[torch.Tensor]]:
    """Taylor scores of every head and MLP channel of an IntentClassifier's BERT encoder:
    {"heads": [(H,) per layer], "channels": [(F,) per layer]}, summed over batches of `texts`.
    `importance_fn(act, grad, unit_size)` scores units (lab a08's exercise 1); the activations are
    the inputs of each layer's attention output projection and MLP down projection, the loss the
    classifier's cross-entropy on `labels` (or `loss_fn(logits, labels)`)."""
    layers = list(clf.encoder.encoder.layer)
    targets = [m for layer in layers for m in (layer.attention.output.dense, layer.output.dense)]
    y = torch.as_tensor(labels, device=clf.device)
    scores: list[torch.Tensor | None] = [None] * len(targets)
    was = clf.training
    clf.eval()
    try:
        for i in range(0, len(texts), batch_size):
            seen: dict[int, torch.Tensor] = {}
            handles = [m.register_forward_pre_hook(lambda _m, a, k=k: seen.__setitem__(k, a[0]))
                       for k, m in enumerate(targets)]
            try:
                logits = clf(list(texts[i:i + batch_size]))
            finally:
                for h in handles:
                    h.remove()
            yb = y[i:i + batch_size]
            loss = F.cross_entropy(logits, yb) if loss_fn is None else loss_fn(logits, yb)
            grads = torch.autograd.grad(loss, [seen[k] for k in range(len(targets))])
            for k, g in enumerate(grads):
                size = layers[k // 2].attention.self.attention_head_size if k % 2 == 0 else 1
                s = importance_fn(seen[k].detach(), g.detach(), size).detach().float().cpu()
                scores[k] = s if scores[k] is None else scores[k] + s
    finally:
        clf.train(was)
    return {"heads": scores[0::2], "channels": scores[1::2]}


def keep_highest(scores: torch.Tensor, keep_fraction: float) -> list[int]:
    """Indices of the round(keep_fraction * n) highest scores (at least one), sorted."""
    if not 0.0 < keep_fraction <= 1.0:
        raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
    k = max(1, round(keep_fraction * scores.numel()))
    return sorted(torch.topk(scores.float(), k).indices.tolist())


class Int8Embedding(nn.Module):
    """An embedding table stored as int8 rows with one fp32 absmax scale per row (camplib.quant);
    a lookup dequantizes only the rows it reads."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        q, scale = quantize_absmax(embedding.weight.detach(), 8, "channel")
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)
        self.num_embeddings, self.embedding_dim = q.shape
        self.padding_idx = embedding.padding_idx

    @property
    def weight(self) -> torch.Tensor:
        return self.qweight.float() * self.scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.qweight[ids].float() * self.scale[ids]


def serialized_bytes(module: nn.Module) -> int:
    """Bytes of the module's state dict written as safetensors (what one would ship)."""
    state = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    seen, unique = set(), {}
    for k, v in state.items():                 # safetensors refuses shared storages: tied tensors once
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if key not in seen:
            seen.add(key)
            unique[k] = v.clone() if v.untyped_storage().nbytes() != v.numel() * v.element_size() else v
    return len(safetensors_bytes(unique))


def weight_count(module: nn.Module) -> int:
    """Parameters as a model's weights, whatever their storage: float parameters, plus the int8
    codes of quantized layers (one per weight; their scales are bookkeeping, counted in bytes)."""
    total = sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
    total += sum(b.numel() for name, b in module.named_buffers() if name.endswith("qweight") and b.dtype == torch.int8)
    total += sum(b.numel() for name, b in module.named_buffers() if name.endswith("bias") and b is not None
                 and b.is_floating_point())
    return total

