"""Run a collective (a student's ring all-reduce, say) on N ranks: each rank starts from its own
input, and what comes back is its output, the bytes it sent and the collectives it called.
A rank function and one call of camplib.dist.on_ranks (lab b06's tests use it through `make`).
"""
from __future__ import annotations

import torch

from .ranks import on_ranks

__all__ = ["run_collective", "collective_rank"]


def collective_rank(rank: int, world_size: int, fn, tensor: torch.Tensor) -> dict:
    """One rank: `fn` on a copy of this rank's own input (what camplib.dist.separate runs)."""
    tensor = tensor.clone()
    returned = fn(tensor)
    return {"outputs": returned if isinstance(returned, torch.Tensor) else tensor}


def _collective_rank(rank: int, world_size: int, fn, inputs: list[torch.Tensor]) -> dict:
    return collective_rank(rank, world_size, fn, inputs[rank])


def run_collective(fn, inputs: list[torch.Tensor], backend: str | None = None, timeout: float = 60.0) -> dict:
    """Run `fn(tensor)` on len(inputs) ranks, rank r starting from a copy of inputs[r]. Returns
    on_ranks' format: "outputs" (what fn returned, or its argument if it returned None),
    "bytes_sent" (point-to-point) and "calls" (torch.distributed functions), one entry per rank."""
    return on_ranks(_collective_rank, len(inputs), fn, list(inputs), backend=backend, timeout=timeout)
