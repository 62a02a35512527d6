"""Gradient compression seen from the outside: the same small model trained data-parallel on N
ranks once per method, with its loss curve, its loss on held-out data and the bytes a rank sent
per step, counted on the collectives (camplib.dist.count_bytes) (lab a02's plot).
Methods: "none" (fp32 ring), "fp16", "int8" (compressed ring), "topk" (top-k with error
feedback), "topk_noef" (the same top-k, the rest dropped: no error feedback).
A rank function plus one call of camplib.dist.on_ranks; camplib.parallel.data.compression never
imports this module.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from camplib.dist.counting import count_bytes
from camplib.dist.ranks import on_ranks

from .compression import compressed_all_reduce, sparse_all_reduce, topk_error_feedback
from camplib.parallel.model_specs import batch_loss, build_model

__all__ = ["compression_loss_curves", "step_with_summed_grads"]


def step_with_summed_grads(opt, params, flat: torch.Tensor, world_size: int) -> None:
    """Average `flat` (the gradients of `params`, concatenated and summed over the ranks) into
    each parameter's .grad, then step `opt`."""
    flat /= world_size
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    opt.step()


def _synced_step(model, params, opt, loss, method, residual, k, block, world_size):
    """One SGD step whose gradient is averaged over the ranks with `method`; returns the residual
    (top-k's error feedback) and the bytes this rank sent."""
    loss.backward()
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    with count_bytes() as sent:
        if method in ("topk", "topk_noef"):
            update, left = topk_error_feedback(flat, residual, k)
            residual = left if method == "topk" else residual     # no error feedback: the rest is lost
            flat = sparse_all_reduce(update, k)
        else:
            compressed_all_reduce(flat, method, block)
    step_with_summed_grads(opt, params, flat, world_size)
    return residual, sent.sent


def _train_with(rank, world_size, method, spec, data, steps, lr, topk_ratio, block, heldout):
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
    with torch.no_grad():     # every rank holds the same model: evaluate it on data it never saw
        held = batch_loss(model, spec, heldout["x"], heldout["y"]).item()
    return losses, sent / steps, numel, held


def _curves_rank(rank, world_size, methods, sizes, data, steps, lr, topk_ratio, block, heldout):
    spec = {"kind": "mlp", "sizes": sizes, "seed": 0}
    out = {"losses": {}, "bytes_per_step": {}, "heldout": {}}
    for method in methods:
        (out["losses"][method], out["bytes_per_step"][method], out["n_params"],
         out["heldout"][method]) = _train_with(rank, world_size, method, spec, data, steps, lr, topk_ratio, block,
                                               heldout)
    return out


def compression_loss_curves(world_size: int, sizes: list[int], steps: int, batch: int = 32, lr: float = 0.05,
                            methods=("none", "fp16", "int8", "topk"), topk_ratio: float = 0.01, block: int = 256,
                            seed: int = 0, timeout: float = 120.0, heldout_batch: int = 256) -> dict:
    """Train an MLP (`sizes`) to fit a fixed random teacher, data-parallel on `world_size` ranks,
    once per gradient compression method (SGD, momentum 0.9). Returns {"losses": {method:
    [full-batch loss per step]}, "bytes_per_step": {method: bytes rank 0 sent per step},
    "heldout": {method: loss of the trained model on `heldout_batch` examples no step saw},
    "n_params": Ψ}: rank 0's entries of the on_ranks run. "none" is the uncompressed fp32 ring
    all-reduce. The teacher is a one-hidden-layer tanh network, so the task is not linear."""
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(sizes[0], 2 * sizes[0], generator=g) / sizes[0] ** 0.5
    w2 = torch.randn(2 * sizes[0], sizes[-1], generator=g) / (2 * sizes[0]) ** 0.5

    def teacher(x):
        return torch.tanh(x @ w1) @ w2

    x = torch.randn(steps, batch, sizes[0], generator=g)
    held_x = torch.randn(heldout_batch, sizes[0], generator=g)
    data, heldout = {"x": x, "y": teacher(x)}, {"x": held_x, "y": teacher(held_x)}
    run = on_ranks(_curves_rank, world_size, tuple(methods), list(sizes), data, steps, lr, topk_ratio, block,
                   heldout, backend="gloo", timeout=timeout)
    return {key: run[key][0] for key in ("losses", "bytes_per_step", "n_params", "heldout")}
