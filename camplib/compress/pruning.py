"""Structured pruning: remove whole attention heads and MLP channels, so the model really shrinks.

Unstructured pruning zeroes single weights and saves nothing on dense hardware; removing a
*unit* (a head: D columns of the output projection and its q/k/v rows; an MLP channel: one row
of the up projection(s) and one column of the down projection) leaves smaller dense matrices
that every kernel runs faster. Which units go is decided by an importance score; the course
uses the first-order Taylor score of Michel et al. 2019 ("Are Sixteen Heads Really Better than
One?"): for a gate xi_u multiplying unit u's output a_u,

    I_u = E_sequences | dL/dxi_u | = E_s | sum_{t, d in u} a[t, d] * dL/da[t, d] |

the loss change to first order when the unit is removed. One backward pass scores every unit.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager

import torch
from torch import nn

from camplib.attention import MultiHeadAttention
from camplib.compress.slicing import sliced_linear
from camplib.memory import storage_bytes
from camplib.model import MLP, SwiGLU

__all__ = [
    "forward_latency",
    "keep_top",
    "model_size",
    "prune_heads",
    "prune_mlp",
    "prune_model",
    "unit_importance",
    "unit_scores",
]


def unit_importance(act: torch.Tensor, grad: torch.Tensor, unit_size: int) -> torch.Tensor:
    """Taylor importance of units of `unit_size` consecutive features of the last dimension.

    act, grad: (B, T, U * unit_size), a layer's activation and dL/d(activation); returns (U,)
    = mean over the batch of |sum over T and the unit's features of act * grad|. The absolute
    value is taken per sequence (after summing), as the gate's gradient is.
    """
    if act.shape != grad.shape or act.dim() != 3:
        raise ValueError(f"act and grad must be the same (B, T, F) shape, got {tuple(act.shape)} and {tuple(grad.shape)}")
    if unit_size < 1 or act.shape[-1] % unit_size:
        raise ValueError(f"unit_size={unit_size} does not divide the {act.shape[-1]} features")
    B, T, F = act.shape
    per_unit = (act * grad).reshape(B, T, F // unit_size, unit_size).sum(dim=(1, 3))
    return per_unit.abs().mean(0)


def _checked_keep(keep, n: int, what: str) -> list[int]:
    keep = sorted(int(k) for k in keep)
    if not keep:
        raise ValueError(f"cannot prune every {what}: keep at least one of {n}")
    if len(set(keep)) != len(keep) or keep[0] < 0 or keep[-1] >= n:
        raise ValueError(f"keep={keep}: {what} indices must be distinct and in [0, {n})")
    return keep


def prune_heads(attn: MultiHeadAttention, keep) -> None:
    """Keep only the query heads in `keep` (in place): q rows of qkv and columns of proj are cut.

    With grouped-query attention (n_kv_heads < n_heads) query head h reads kv head
    h // (n_heads // n_kv_heads). A kv head whose whole group is pruned goes too; every group
    that stays must keep the same number of query heads, or the layer is no longer GQA.
    """
    H, Hkv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    keep = _checked_keep(keep, H, "attention head")
    group = H // Hkv
    per_group = [sum(1 for h in keep if h // group == g) for g in range(Hkv)]
    kept_groups = [g for g, n in enumerate(per_group) if n]
    if len({per_group[g] for g in kept_groups}) != 1:
        raise ValueError(f"pruning heads to {keep} breaks grouped-query attention: the {Hkv} kv groups "
                         f"(of {group} query heads) would keep {per_group} query heads; keep the same "
                         f"number in every group that stays")
    q_rows = [h * D + d for h in keep for d in range(D)]
    kv_rows = [g * D + d for g in kept_groups for d in range(D)]
    rows = q_rows + [H * D + r for r in kv_rows] + [(H + Hkv) * D + r for r in kv_rows]
    attn.qkv = sliced_linear(attn.qkv, rows=rows)
    attn.proj = sliced_linear(attn.proj, cols=q_rows)
    attn.n_heads, attn.n_kv_heads = len(keep), len(kept_groups)


def prune_mlp(mlp: nn.Module, keep) -> None:
    """Keep only the hidden channels in `keep` (in place): rows of the up projection(s) (and
    their biases), columns of the down projection (its bias is per output, unchanged)."""
    if isinstance(mlp, SwiGLU):
        ups, down = ["gate", "up"], "down"
    elif isinstance(mlp, MLP):
        ups, down = ["fc"], "proj"
    else:
        raise TypeError(f"prune_mlp expects camplib.model.MLP or SwiGLU, got {type(mlp).__name__}")
    keep = _checked_keep(keep, getattr(mlp, down).in_features, "MLP channel")
    for name in ups:
        setattr(mlp, name, sliced_linear(getattr(mlp, name), rows=keep))
    setattr(mlp, down, sliced_linear(getattr(mlp, down), cols=keep))


@contextmanager
def _capture_inputs(modules: dict[str, nn.Module]):
    """Record each module's input activation while the model runs."""
    seen: dict[str, list[torch.Tensor]] = {name: [] for name in modules}

    def hook_for(name):
        def hook(_module, args):
            seen[name].append(args[0])
        return hook

    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in modules.items()]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def unit_scores(model: nn.Module, batches) -> dict[str, torch.Tensor]:
    """Taylor scores of every head (`blocks.i.attn`: (H,)) and MLP channel (`blocks.i.mlp`: (F,))
    of a camplib GPT, summed over `batches` of (inputs, targets). Parameters get no gradient kept."""
    targets = {}
    for i, block in enumerate(model.blocks):
        targets[f"blocks.{i}.attn"] = block.attn.proj
        targets[f"blocks.{i}.mlp"] = block.mlp.down if isinstance(block.mlp, SwiGLU) else block.mlp.proj
    scores: dict[str, torch.Tensor] = {}
    was_training = model.training
    model.eval()
    try:
        for x, y in batches:
            with _capture_inputs(targets) as seen:
                emb = model.tok_emb.weight
                needs = emb.requires_grad
                emb.requires_grad_(True)             # activations need a graph even if frozen
                _, loss = model(x, y)
                names = list(seen)
                acts = [seen[n][0] for n in names]
                grads = torch.autograd.grad(loss, acts)
                emb.requires_grad_(needs)
            for name, a, g in zip(names, acts, grads):
                size = model.blocks[int(name.split(".")[1])].attn.head_dim if name.endswith("attn") else 1
                s = unit_importance(a.detach(), g, size)
                scores[name] = scores[name] + s if name in scores else s
    finally:
        model.train(was_training)
    return scores


def keep_top(scores: torch.Tensor, ratio: float, groups: int = 1) -> list[int]:
    """Indices of the units to keep when a fraction `ratio` in [0, 1) is pruned: floor(ratio *
    size) units go from each of `groups` equal groups (GQA), at least one stays; the highest
    scores stay."""
    if not 0.0 <= ratio < 1.0 or math.isnan(ratio):
        raise ValueError(f"pruning ratio must be in [0, 1), got {ratio}")
    n = scores.numel()
    if groups < 1 or n % groups:
        raise ValueError(f"{n} units cannot be split into {groups} equal groups")
    size = n // groups
    k = max(1, size - math.floor(ratio * size))
    keep = []
    for g in range(groups):
        top = torch.topk(scores[g * size:(g + 1) * size], k).indices
        keep += [g * size + int(i) for i in top]
    return sorted(keep)


def prune_model(model: nn.Module, scores: dict[str, torch.Tensor], head_ratio: float, mlp_ratio: float) -> None:
    """Prune every block of a camplib GPT in place by `unit_scores`: a fraction `head_ratio` of
    each layer's query heads and `mlp_ratio` of its MLP channels. With plain multi-head attention
    the best heads overall stay (each takes its own kv head along); with GQA the same number per
    kv group, so every group keeps its shared key/value head."""
    for i, block in enumerate(model.blocks):
        attn = block.attn
        groups = 1 if attn.n_kv_heads == attn.n_heads else attn.n_kv_heads
        prune_heads(attn, keep_top(scores[f"blocks.{i}.attn"], head_ratio, groups=groups))
        prune_mlp(block.mlp, keep_top(scores[f"blocks.{i}.mlp"], mlp_ratio))


def model_size(model: nn.Module) -> dict[str, int]:
    """Parameters (tied tensors once) and the bytes of their storages."""
    unique = {id(p): p for p in model.parameters()}
    return {"parameters": sum(p.numel() for p in unique.values()), "bytes": storage_bytes(model.parameters())}


@torch.no_grad()
def forward_latency(model: nn.Module, x: torch.Tensor, repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of one forward pass on x (synchronising CUDA around each)."""
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        model(x)
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        model(x)
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
