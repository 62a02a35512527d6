"""The one way to run a function on N ranks and look at it from the outside: what tests, the
grader, benchmarks and lab demos use (camplib.dist.harness, camplib.parallel.data.run,
zero.run and data.compression_run are each a rank function plus one call of it).

    out = on_ranks(rank_fn, world_size, *args)

runs `rank_fn(rank, world_size, *args)` on every rank (through `launch`, so failures are loud
and bounded) inside `count_bytes()`. Each rank returns a dict of plain data (tensors, numbers,
lists, dicts: the model and the optimizer stay on the rank), and the result is one format:

    {key: [rank 0's value, rank 1's value, ...] for every key the ranks returned,
     "bytes_sent": [bytes each rank sent point-to-point],
     "calls": [{ProcessGroup method: number of calls} per rank]}

"bytes_sent" and "calls" cover the whole of rank_fn (building a model sends nothing); a rank
function that needs them per step opens its own `count_bytes()` inside (they nest) and returns
its numbers under other keys. Every rank must return the same keys.
"""
from __future__ import annotations

import warnings

from .counting import count_bytes
from .launch import launch

__all__ = ["on_ranks"]

MEASURED = ("bytes_sent", "calls")   # keys on_ranks adds; a rank function may not return them


def on_ranks(rank_fn, world_size: int, *args, backend: str | None = None, timeout: float = 60.0,
             run_timeout: float | None = None) -> dict:
    """{key: [value per rank]} of what `rank_fn(rank, world_size, *args)` returned on each rank,
    plus "bytes_sent" and "calls" per rank. `backend`, `timeout` (seconds per collective) and
    `run_timeout` (seconds for the whole run) go to `launch`."""
    ranks = launch(_measured, world_size, rank_fn, args, backend=backend, timeout=timeout,
                   run_timeout=run_timeout)
    keys = list(ranks[0]["returned"])
    for rank, got in enumerate(ranks):
        if sorted(got["returned"]) != sorted(keys):
            raise ValueError(f"{_name(rank_fn)} returned keys {sorted(got['returned'])} on rank {rank} "
                             f"but {sorted(keys)} on rank 0: every rank must return the same keys")
    out = {key: [got["returned"][key] for got in ranks] for key in keys}
    for key in MEASURED:
        out[key] = [got[key] for got in ranks]
    return out


def _measured(rank: int, world_size: int, rank_fn, args: tuple) -> dict:
    _quiet()
    with count_bytes() as counter:
        returned = rank_fn(rank, world_size, *args)
    return _checked(returned, rank_fn, rank, counter)


def _quiet() -> None:
    # torch 2.13 renamed reduce_scatter_tensor / all_gather_into_tensor to *_single; a student's
    # code may use the old names, and a warning on a rank reaches the notebook's stderr, which
    # fails a graded cell
    warnings.filterwarnings("ignore", message=r".*is deprecated\. Please use .*_single", category=FutureWarning)


def _checked(returned, rank_fn, rank: int, counter) -> dict:
    """A rank's result in on_ranks' format: what `rank_fn` returned (a dict of plain data, none of
    MEASURED's keys) and what `counter` (count_bytes) counted."""
    if not isinstance(returned, dict):
        raise TypeError(f"{_name(rank_fn)} returned a {type(returned).__name__} on rank {rank}: "
                        "a rank function for on_ranks returns a dict of plain data")
    clash = sorted(set(returned) & set(MEASURED))
    if clash:
        raise ValueError(f"{_name(rank_fn)} returned the keys {clash}, which on_ranks fills in itself "
                         "(bytes sent and calls over the whole rank function): name yours differently")
    return {"returned": returned, "bytes_sent": counter.sent, "calls": dict(counter.calls)}


def _name(fn) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)
