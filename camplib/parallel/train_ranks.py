"""Data-parallel training on N ranks, seen from the outside: what tests, benchmarks and the
lab's grader use to compare a data-parallel wrapper with one process training on the full batch.

Only plain data crosses: the model is built inside each rank from a config dict, and the results
come back as tensors, numbers and lists. Each rank builds its model with its *own* seed
(`seed + rank`), as separate machines would: unless the wrapper broadcasts rank 0's weights,
the ranks train different models, and the comparison shows it.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from .model_specs import batch_loss, build_model

__all__ = ["build_model", "train_reference", "train_on_ranks", "run_on_module"]


def _optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    raise ValueError(f"unknown optimizer {name!r} (expected 'sgd' or 'adamw')")


def _state(model: nn.Module, buffers: bool = False) -> dict[str, torch.Tensor]:
    named = list(model.named_parameters()) + (list(model.named_buffers()) if buffers else [])
    return {n: p.detach().cpu().clone() for n, p in named}


def train_reference(model_cfg: dict, x: torch.Tensor, y: torch.Tensor, steps: int = 3, lr: float = 0.1,
                    seed: int = 0, optimizer: str = "sgd") -> dict:
    """One process, the full batch: what N data-parallel ranks must reproduce (rank 0's init).
    Returns {"initial": {name: tensor}, "params": {name: tensor}, "losses": [float per step]}."""
    model = build_model(model_cfg, seed)
    initial = _state(model)
    opt = _optimizer(optimizer, model.parameters(), lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = batch_loss(model, model_cfg, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"initial": initial, "params": _state(model), "losses": losses}


def _wrap(wrapper, model: nn.Module, bucket_mb: float, device: torch.device):
    if wrapper is None:
        return model
    if wrapper == "ddp":   # torch's own, for comparisons
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       bucket_cap_mb=bucket_mb)
    return wrapper(model, bucket_mb=bucket_mb)


def _train_rank(rank: int, world_size: int, wrapper, model_cfg: dict, x: torch.Tensor, y: torch.Tensor,
                steps: int, lr: float, bucket_mb: float, seed: int, optimizer: str, micro_batches: int) -> dict:
    import torch.distributed as dist

    from camplib.dist.counting import count_bytes
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if dist.get_backend() == "nccl" else torch.device("cpu")
    model = build_model(model_cfg, seed + rank).to(device)
    x_shard, y_shard = x.chunk(world_size)[rank].to(device), y.chunk(world_size)[rank].to(device)
    with count_bytes() as counter:
        wrapped = _wrap(wrapper, model, bucket_mb, device)
        initial = _state(model)
        opt = _optimizer(optimizer, model.parameters(), lr)
        losses = []
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for i, (xm, ym) in enumerate(zip(x_shard.chunk(micro_batches), y_shard.chunk(micro_batches))):
                last = i == micro_batches - 1
                context = wrapped.no_sync() if not last and hasattr(wrapped, "no_sync") else contextlib.nullcontext()
                with context:
                    loss = batch_loss(wrapped, model_cfg, xm, ym) / micro_batches
                    loss.backward()
                total += loss.item()
            if hasattr(wrapped, "finish_gradient_sync"):
                wrapped.finish_gradient_sync()
            opt.step()
            losses.append(total)
    timeline = wrapped.timeline.as_dicts() if hasattr(getattr(wrapped, "timeline", None), "as_dicts") else []
    return {"initial": initial, "params": _state(model), "losses": losses, "calls": dict(counter.calls),
            "timeline": timeline}


def train_on_ranks(wrapper, world_size: int, model_cfg: dict, x: torch.Tensor, y: torch.Tensor, steps: int = 3,
                   lr: float = 0.1, bucket_mb: float = 25.0, seed: int = 0, optimizer: str = "sgd",
                   micro_batches: int = 1, backend: str | None = None, timeout: float = 60.0) -> dict:
    """Train `build_model(model_cfg, seed + rank)` on every rank, wrapped as
    `wrapper(model, bucket_mb=bucket_mb)` ("ddp": torch's DistributedDataParallel; None: no
    wrapper), for `steps` optimizer steps on the rank's shard `x.chunk(world_size)[rank]` of one
    fixed batch (rows divisible by world_size), in `micro_batches` micro-batches (all but the
    last under `wrapper.no_sync()`). After each backward, `finish_gradient_sync()` is called if
    the wrapper has it. Returns lists with one entry per rank: "initial" (parameters right after
    wrapping), "params" (after training), "losses" (per step), "calls" (torch.distributed
    operations counted by camplib.dist.counting: "broadcast", "allreduce", ...) and "timeline"."""
    from camplib.dist import launch
    if x.shape[0] % (world_size * micro_batches):
        raise ValueError(f"a batch of {x.shape[0]} rows does not split into {world_size} ranks x "
                         f"{micro_batches} micro-batches")
    ranks = launch(_train_rank, world_size, wrapper, dict(model_cfg), x, y, steps, lr, bucket_mb, seed,
                   optimizer, micro_batches, backend=backend, timeout=timeout)
    return {key: [r[key] for r in ranks] for key in ("initial", "params", "losses", "calls", "timeline")}


def _module_rank(rank: int, world_size: int, fn, model_cfg: dict, seed: int, fn_kwargs: dict) -> dict:
    from camplib.dist.counting import count_bytes
    model = build_model(model_cfg, seed + rank)
    with torch.no_grad():   # buffers that differ per rank too (BatchNorm's running statistics)
        for b in model.buffers():
            if b.is_floating_point():
                b.add_(rank + 1)
    before = _state(model, buffers=True)
    with count_bytes() as counter:
        fn(model, **fn_kwargs)
    return {"before": before, "after": _state(model, buffers=True), "calls": dict(counter.calls)}


def run_on_module(fn, world_size: int, model_cfg: dict, seed: int = 0, fn_kwargs: dict | None = None,
                  backend: str | None = None, timeout: float = 60.0) -> dict:
    """Call `fn(model, **fn_kwargs)` on every rank, each with its own `build_model(model_cfg,
    seed + rank)` (floating-point buffers shifted by rank + 1, so they differ too): a broadcast
    of initial weights, say. Returns per-rank lists "before" and "after" ({name: tensor},
    parameters and buffers) and "calls" (torch.distributed operations, camplib.dist.counting)."""
    from camplib.dist import launch
    ranks = launch(_module_rank, world_size, fn, dict(model_cfg), seed, dict(fn_kwargs or {}),
                   backend=backend, timeout=timeout)
    return {key: [r[key] for r in ranks] for key in ("before", "after", "calls")}
