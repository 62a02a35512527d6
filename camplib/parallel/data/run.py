"""Data-parallel training on N ranks, seen from the outside: what tests, benchmarks and lab b06's
grader use to compare a data-parallel wrapper with one process training on the full batch.
Each runner is a rank function plus one call of camplib.dist.on_ranks (results: {key: [value per
rank]} plus "bytes_sent" and "calls"); camplib.parallel.data.wrapper never imports this module.

Only plain data crosses: the model is built inside each rank from a spec dict
(camplib.parallel.model_specs), and the results come back as tensors, numbers and lists. Each
rank builds its model with its *own* seed (`seed + rank`), as separate machines would: unless the
wrapper broadcasts rank 0's weights, the ranks train different models, and the comparison shows it.

The grader runs b06's tests on ranks it starts itself (autograder.checks.separate_ranks), each
holding only its own input: `train_inputs` / `train_rank` (a rank's own initial weights and its
own rows of the batch) and `module_inputs` / `module_rank` (a rank's own weights and buffers).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from camplib.dist.ranks import on_ranks

from camplib.parallel.model_specs import batch_loss, build_model, model_with_weights
from camplib.parallel.reference import make_optimizer, parameters_of, reference_run, repeat_batch

__all__ = ["build_model", "train_reference", "train_on_ranks", "run_on_module", "train_inputs", "train_rank",
           "module_inputs", "module_rank"]


def _hyper(optimizer: str, lr: float) -> dict:
    return {"lr": lr, "weight_decay": 0.01} if optimizer == "adamw" else {"lr": lr}


def train_reference(model_cfg: dict, x: torch.Tensor, y: torch.Tensor, steps: int = 3, lr: float = 0.1,
                    seed: int = 0, optimizer: str = "sgd") -> dict:
    """What `train_on_ranks` must reproduce (rank 0's init, the full batch x, y at every step):
    camplib.parallel.reference.reference_run with train_on_ranks' arguments. Returns
    {"initial": {name: tensor}, "params": {name: tensor}, "losses": [float per step]}."""
    return reference_run(model_cfg, repeat_batch(x, y, steps), steps, optimizer, _hyper(optimizer, lr), seed)


def _wrap(wrapper, model: nn.Module, bucket_mb: float, device: torch.device):
    if wrapper is None:
        return model
    if wrapper == "ddp":   # torch's own, for comparisons
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       bucket_cap_mb=bucket_mb)
    return wrapper(model, bucket_mb=bucket_mb)


def _train_rank(rank: int, world_size: int, wrapper, model_cfg: dict, data: dict, steps: int, lr: float,
                bucket_mb: float, seed: int, optimizer: str, micro_batches: int) -> dict:
    shards = {k: [data[k][s].chunk(world_size)[rank] for s in range(steps)] for k in ("x", "y")}
    return _train(wrapper, model_cfg, build_model(model_cfg, seed + rank), shards, steps, lr, bucket_mb, optimizer,
                  micro_batches)


def _train(wrapper, model_cfg: dict, model: nn.Module, shards: dict, steps: int, lr: float, bucket_mb: float,
           optimizer: str, micro_batches: int) -> dict:
    """One rank's training on its own rows `shards` ({"x": [per step], "y": [per step]})."""
    import torch.distributed as dist
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if dist.get_backend() == "nccl" else torch.device("cpu")
    model = model.to(device)
    wrapped = _wrap(wrapper, model, bucket_mb, device)
    initial = parameters_of(model)
    opt = make_optimizer(optimizer, model.parameters(), _hyper(optimizer, lr))
    losses = []
    for s in range(steps):
        x, y = (shards[k][s].to(device) for k in ("x", "y"))
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i, (xm, ym) in enumerate(zip(x.chunk(micro_batches), y.chunk(micro_batches))):
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
    return {"initial": initial, "params": parameters_of(model), "losses": losses, "timeline": timeline}


def train_on_ranks(wrapper, world_size: int, model_cfg: dict, x: torch.Tensor, y: torch.Tensor, steps: int = 3,
                   lr: float = 0.1, bucket_mb: float = 25.0, seed: int = 0, optimizer: str = "sgd",
                   micro_batches: int = 1, backend: str | None = None, timeout: float = 60.0) -> dict:
    """Train `build_model(model_cfg, seed + rank)` on every rank, wrapped as
    `wrapper(model, bucket_mb=bucket_mb)` ("ddp": torch's DistributedDataParallel; None: no
    wrapper), for `steps` optimizer steps on the rank's shard `x.chunk(world_size)[rank]` of one
    fixed batch (rows divisible by world_size), in `micro_batches` micro-batches (all but the
    last under `wrapper.no_sync()`). After each backward, `finish_gradient_sync()` is called if
    the wrapper has it. Returns on_ranks' format, one entry per rank: "initial" (parameters right
    after wrapping), "params" (after training), "losses" (the rank's own, per step), "timeline"
    (the wrapper's, if it keeps one), "calls" (torch.distributed operations: "broadcast",
    "allreduce", ...) and "bytes_sent"."""
    if x.shape[0] % (world_size * micro_batches):
        raise ValueError(f"a batch of {x.shape[0]} rows does not split into {world_size} ranks x "
                         f"{micro_batches} micro-batches")
    return on_ranks(_train_rank, world_size, wrapper, dict(model_cfg), repeat_batch(x, y, steps), steps, lr,
                    bucket_mb, seed, optimizer, micro_batches, backend=backend, timeout=timeout)


def train_inputs(world_size: int, model_cfg: dict, x: torch.Tensor, y: torch.Tensor, steps: int = 3,
                 lr: float = 0.1, bucket_mb: float = 25.0, seed: int = 0, optimizer: str = "sgd",
                 micro_batches: int = 1) -> list[dict]:
    """What `train_rank` gets on each rank for `train_on_ranks`' run: the weights of
    `build_model(model_cfg, seed + rank)` and the rank's own rows `x.chunk(world_size)[rank]`,
    nothing of another rank's. The full-batch result needs every rank's rows, and rank 0's
    weights reach the others only by a broadcast."""
    if x.shape[0] % (world_size * micro_batches):
        raise ValueError(f"a batch of {x.shape[0]} rows does not split into {world_size} ranks x "
                         f"{micro_batches} micro-batches")
    hyper = {"cfg": dict(model_cfg), "steps": steps, "lr": lr, "bucket_mb": bucket_mb, "optimizer": optimizer,
             "micro_batches": micro_batches}
    return [hyper | {"state": dict(build_model(model_cfg, seed + rank).state_dict()),
                     "x": x.chunk(world_size)[rank].clone(), "y": y.chunk(world_size)[rank].clone()}
            for rank in range(world_size)]


def train_rank(rank: int, world_size: int, wrapper, mine: dict) -> dict:
    """One rank of `train_on_ranks` holding only its `train_inputs` (the rows of one fixed batch at
    every step): what autograder.checks.separate_ranks hands each rank."""
    model = model_with_weights(mine["cfg"], mine["state"])
    steps = mine["steps"]
    return _train(wrapper, mine["cfg"], model, {"x": [mine["x"]] * steps, "y": [mine["y"]] * steps}, steps,
                  mine["lr"], mine["bucket_mb"], mine["optimizer"], mine["micro_batches"])


def module_inputs(world_size: int, model_cfg: dict, generator: torch.Generator, fn_kwargs: dict | None = None
                  ) -> list[dict]:
    """What `module_rank` gets on each rank: the weights and floating-point buffers of
    `build_model(model_cfg)` drawn afresh from `generator` for each rank (integer buffers kept),
    so that no rank can compute another's; and `fn_kwargs`."""
    template = build_model(model_cfg, 0).state_dict()
    return [{"cfg": dict(model_cfg), "kwargs": dict(fn_kwargs or {}),
             "state": {n: (torch.randn(t.shape, generator=generator, dtype=t.dtype) if t.is_floating_point()
                           else t.clone()) for n, t in template.items()}}
            for _ in range(world_size)]


def module_rank(rank: int, world_size: int, fn, mine: dict) -> dict:
    """One rank of `run_on_module` holding only its own `module_inputs`: `fn(model, **kwargs)` on
    a model carrying this rank's weights. Returns {"after": {name: tensor}} (parameters and buffers)."""
    model = model_with_weights(mine["cfg"], mine["state"])
    fn(model, **mine["kwargs"])
    return {"after": parameters_of(model, buffers=True)}


def _module_rank(rank: int, world_size: int, fn, model_cfg: dict, seed: int, fn_kwargs: dict) -> dict:
    model = build_model(model_cfg, seed + rank)
    with torch.no_grad():   # buffers that differ per rank too (BatchNorm's running statistics)
        for b in model.buffers():
            if b.is_floating_point():
                b.add_(rank + 1)
    before = parameters_of(model, buffers=True)
    fn(model, **fn_kwargs)
    return {"before": before, "after": parameters_of(model, buffers=True)}


def run_on_module(fn, world_size: int, model_cfg: dict, seed: int = 0, fn_kwargs: dict | None = None,
                  backend: str | None = None, timeout: float = 60.0) -> dict:
    """Call `fn(model, **fn_kwargs)` on every rank, each with its own `build_model(model_cfg,
    seed + rank)` (floating-point buffers shifted by rank + 1, so they differ too): a broadcast
    of initial weights, say. Returns on_ranks' format: per-rank "before" and "after" ({name:
    tensor}, parameters and buffers), "calls" and "bytes_sent"."""
    return on_ranks(_module_rank, world_size, fn, dict(model_cfg), seed, dict(fn_kwargs or {}),
                    backend=backend, timeout=timeout)
