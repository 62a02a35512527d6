"""Run a piece of code on N ranks and bring back plain data: what labs' tests, the grader and the
benchmarks use to look at a distributed function from the outside (outputs, bytes, calls).

These helpers take the function under test as an argument, so a lab can hand a student's
collective to them; only tensors and plain data come back.
"""
from __future__ import annotations

import torch

from .launch import launch

__all__ = ["run_collective"]


def _collective_rank(rank: int, world_size: int, fn, inputs: list[torch.Tensor]) -> dict:
    from .counting import count_bytes
    tensor = inputs[rank].clone()
    with count_bytes() as counter:
        returned = fn(tensor)
    out = returned if isinstance(returned, torch.Tensor) else tensor
    return {"output": out, "bytes_sent": counter.sent, "calls": dict(counter.calls)}


def run_collective(fn, inputs: list[torch.Tensor], backend: str | None = None, timeout: float = 60.0) -> dict:
    """Run `fn(tensor)` (an all-reduce, say) on len(inputs) ranks, rank r starting from a copy of
    inputs[r]. Returns {"outputs": [...], "bytes_sent": [...], "calls": [{op: count}, ...]} per
    rank: what fn returned (or its argument, if it returned None), the bytes each rank sent
    point-to-point, and which torch.distributed functions it called."""
    ranks = launch(_collective_rank, len(inputs), fn, list(inputs), backend=backend, timeout=timeout)
    return {"outputs": [r["output"] for r in ranks], "bytes_sent": [r["bytes_sent"] for r in ranks],
            "calls": [r["calls"] for r in ranks]}
