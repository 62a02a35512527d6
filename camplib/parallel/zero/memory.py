"""How many bytes a rank holds under ZeRO: the paper's formula, and a measurement to check it.

The formula (Rajbhandari et al. 2019, section 3 and figure 1), Ψ parameters, N ranks, bytes
per parameter for the parameters (p), the gradients (g) and the optimizer state (K):

    stage 0 (DP)   p Ψ     + g Ψ     + K Ψ
    stage 1        p Ψ     + g Ψ     + K Ψ / N
    stage 2        p Ψ     + g Ψ / N + K Ψ / N
    stage 3        p Ψ / N + g Ψ / N + K Ψ / N

Mixed precision (the paper's case): p = g = 2 (bf16/fp16), K = 12 (fp32 master copy, exp_avg,
exp_avg_sq): 16Ψ for DP. Pure fp32 Adam: p = g = 4 and K = 8 (the two moments; the fp32
parameters are their own master), 16Ψ as well. `PRECISIONS` names both.

The measurement counts distinct tensor storages that a rank holds between two steps (after
`step()`): the parameters (full views, or the shards in stage 3), the gradients (full buffers or
shards) and the optimizer's tensors (moments, fp32 masters, the 4-byte step counters). Padding
to a multiple of N and the step counters make it slightly larger than the formula: negligible
for a model of more than a few thousand parameters per unit.
"""
from __future__ import annotations

import torch

from camplib.memory import storage_bytes, storage_key

__all__ = ["PRECISIONS", "zero_memory_formula", "zero_memory_held"]

# name -> (bytes per parameter, per gradient, of optimizer state K)
PRECISIONS = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}


def zero_memory_formula(n_params: int, world_size: int, stage: int, param_bytes: int = 2, grad_bytes: int = 2,
                        optimizer_bytes: int = 12) -> dict[str, float]:
    """Bytes per rank of parameters, gradients and optimizer state (and their total) for ZeRO
    `stage` (0 = plain data parallelism), as in the paper."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0, 1, 2 or 3, got {stage}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    n = world_size
    out = {"params": param_bytes * n_params / (n if stage >= 3 else 1),
           "grads": grad_bytes * n_params / (n if stage >= 2 else 1),
           "optimizer": optimizer_bytes * n_params / (n if stage >= 1 else 1)}
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out


def _count(tensors, seen: set) -> int:
    """Bytes of the storages behind `tensors` not counted yet (in `seen`, which this extends)."""
    live = [t for t in tensors if t is not None and t.untyped_storage().nbytes() > 0]  # freed stage-3 buffers hold nothing
    total = storage_bytes(live, exclude=seen)
    seen.update(storage_key(t) for t in live)
    return total


def zero_memory_held(zero) -> dict[str, int]:
    """Bytes that this rank's `ZeroAdamW` (and its model) hold now, by category, each storage
    counted once: {"params", "grads", "optimizer", "total"}. In fp32 a shard that is its own
    master counts as parameters; a separate fp32 master counts as optimizer state (K = 12)."""
    seen: set = set()
    model_params = list(zero.model.parameters())
    shards = [u.shard for u in zero.flat_units]
    out = {"params": _count(model_params + shards, seen)}
    grads = [p.grad for p in model_params] + list(zero.grad_full or []) + list(zero.grad_shards or [])
    out["grads"] = _count(grads, seen)
    state = [t for s in zero.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    out["optimizer"] = _count(list(zero.masters) + state, seen)
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out
