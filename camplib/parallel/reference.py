"""One process on the full batch: the answer that training on N ranks must reproduce.

One data format for every run, single-process or on ranks:

    data = {"x": (steps, B, ...), "y": (steps, B, ...)}

step s trains on the batch x[s], y[s]; on N ranks, rank r takes the rows chunk(N)[r] of it (B
divisible by N), so the averaged gradient is the full batch's. `make_data` draws such batches
for a model spec (camplib.parallel.model_specs); `repeat_batch` turns one fixed batch into it.

`reference_run` trains in a forked child (camplib.dist.in_child): the process that calls it, a
notebook or a test, runs no autograd, so that it can still fork ranks that run backward on a
machine with a GPU (camplib/dist/launch.py says why).
"""
from __future__ import annotations

import torch
from torch import nn

from camplib.dist import in_child

from .model_specs import batch_loss, build_model

__all__ = ["make_data", "repeat_batch", "make_optimizer", "parameters_of", "reference_run"]


def make_data(spec: dict, steps: int, batch: int, seed: int = 0, seq_len: int = 16) -> dict:
    """Random batches for `spec`: regression targets for an MLP, random tokens for a GPT."""
    g = torch.Generator().manual_seed(seed)
    if spec.get("kind", "mlp") == "mlp":
        return {"x": torch.randn(steps, batch, spec["sizes"][0], generator=g),
                "y": torch.randn(steps, batch, spec["sizes"][-1], generator=g)}
    vocab = spec["config"].get("vocab_size", 256)
    tokens = torch.randint(0, vocab, (steps, batch, seq_len + 1), generator=g)
    return {"x": tokens[..., :-1], "y": tokens[..., 1:]}


def repeat_batch(x: torch.Tensor, y: torch.Tensor, steps: int) -> dict:
    """The same batch at every step, in the data format above (a view: no copy)."""
    return {"x": x.expand(steps, *x.shape), "y": y.expand(steps, *y.shape)}


def make_optimizer(name: str, params, hyper: dict) -> torch.optim.Optimizer:
    """torch.optim.SGD ("sgd") or torch.optim.AdamW ("adamw") with keyword arguments `hyper`."""
    if name == "sgd":
        return torch.optim.SGD(params, **hyper)
    if name == "adamw":
        return torch.optim.AdamW(params, **hyper)
    raise ValueError(f"unknown optimizer {name!r} (expected 'sgd' or 'adamw')")


def parameters_of(model: nn.Module, buffers: bool = False) -> dict[str, torch.Tensor]:
    """name -> a detached CPU copy of every parameter (and buffer, if asked)."""
    named = list(model.named_parameters()) + (list(model.named_buffers()) if buffers else [])
    return {n: p.detach().cpu().clone() for n, p in named}


def reference_run(spec: dict, data: dict, steps: int, optimizer: str = "adamw", hyper: dict | None = None,
                  seed: int | None = None) -> dict:
    """Train `build_model(spec, seed)` in one process on the full batches data["x"][s], data["y"][s]
    for `steps` steps with `make_optimizer(optimizer, ..., hyper)`. Returns {"initial": {name:
    tensor}, "params": {name: tensor} after training, "losses": [float per step]}. Computed in a
    forked child: this process stays free of autograd (the module's docstring says why)."""
    return in_child(_train, spec, data, steps, optimizer, hyper, seed)


def _train(spec, data, steps, optimizer, hyper, seed) -> dict:
    model = build_model(spec, seed)
    initial = parameters_of(model)
    opt = make_optimizer(optimizer, model.parameters(), dict(hyper or {}))
    losses = []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = batch_loss(model, spec, data["x"][s], data["y"][s])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"initial": initial, "params": parameters_of(model), "losses": losses}
