"""Gradient compression seen from the outside: the same small model trained data-parallel on N
ranks once per method, with its loss curve and the bytes a rank sent per step (lab a02's plot).
A rank function plus one call of camplib.dist.on_ranks; camplib.parallel.data.compression never
imports this module.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from camplib.dist.counting import count_bytes
from camplib.dist.ranks import on_ranks

from camplib.parallel.data.compression import compressed_all_reduce, sparse_all_reduce, topk_error_feedback
from camplib.parallel.model_specs import batch_loss, build_model

__all__ = ["compression_loss_curves"]


def _synced_step(model, params, opt, loss, method, residual, k, block, world_size):
    """One SGD step whose gradient is averaged over the ranks with `method`; returns the residual
    (top-k's error feedback) and the bytes this rank sent."""
    loss.backward()
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    with count_bytes() as sent:
        if method == "topk":
            update, residual = topk_error_feedback(flat, residual, k)
            flat = sparse_all_reduce(update, k)
        else:
            compressed_all_reduce(flat, method, block)
    flat /= world_size
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    opt.step()
    return residual, sent.sent


def _train_with(rank, world_size, method, spec, data, steps, lr, topk_ratio, block):
    model = build_model(spec)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    numel = sum(p.numel() for p in params)
    residual, k = torch.zeros(numel), max(1, int(topk_ratio * numel))
    losses, sent = [], 0
    for s in range(steps):
        x, y = (data[key][s].chunk(world_size)[rank] for key in ("x", "y"))
        opt.zero_grad()
        loss = batch_loss(model, spec, x, y)
        residual, step_sent = _synced_step(model, params, opt, loss, method, residual, k, block, world_size)
        sent += step_sent
        total = loss.detach().reshape(1).clone()
        dist.all_reduce(total)        # the curve is the full batch's loss
        losses.append(total.item() / world_size)
    return losses, sent / steps, numel


def _curves_rank(rank, world_size, methods, sizes, data, steps, lr, topk_ratio, block):
    spec = {"kind": "mlp", "sizes": sizes, "seed": 0}
    out = {"losses": {}, "bytes_per_step": {}}
    for method in methods:
        out["losses"][method], out["bytes_per_step"][method], out["n_params"] = _train_with(
            rank, world_size, method, spec, data, steps, lr, topk_ratio, block)
    return out


def compression_loss_curves(world_size: int, sizes: list[int], steps: int, batch: int = 32, lr: float = 0.05,
                            methods=("none", "fp16", "int8", "topk"), topk_ratio: float = 0.01, block: int = 256,
                            seed: int = 0, timeout: float = 120.0) -> dict:
    """Train an MLP (`sizes`) to fit a fixed random teacher, data-parallel on `world_size` ranks,
    once per gradient compression method (SGD, momentum 0.9). Returns {"losses": {method:
    [full-batch loss per step]}, "bytes_per_step": {method: bytes rank 0 sent per step},
    "n_params": Ψ}: rank 0's entries of the on_ranks run. "none" is the uncompressed fp32 ring
    all-reduce."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(sizes[0], sizes[-1], generator=g) / sizes[0] ** 0.5
    x = torch.randn(steps, batch, sizes[0], generator=g)
    data = {"x": x, "y": x @ teacher}
    run = on_ranks(_curves_rank, world_size, tuple(methods), list(sizes), data, steps, lr, topk_ratio, block,
                   backend="gloo", timeout=timeout)
    return {key: run[key][0] for key in ("losses", "bytes_per_step", "n_params")}
