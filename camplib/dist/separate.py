"""Ranks that are separate processes started by someone else, each handed only its own input:
how the grader runs a distributed test (autograder.checks.separate_ranks), so that a rank's
correct output proves that data travelled between the ranks.

    out = on_separate_ranks("camplib.dist.harness.collective_rank", fn, per_rank)

gives on_ranks' format ({key: [per rank], "bytes_sent": [...], "calls": [...]}) of
`rank_fn(rank, world_size, fn, per_rank[rank])` on len(per_rank) ranks, plus "collectives": per
rank, the sorted names of the torch.distributed collectives called (barriers aside). Here (a
notebook, a test) the ranks are forked by `on_ranks` and "collectives" comes from their counts;
during grading the grader starts one sandbox per rank, each joining the process group with
`join_and_run` and receiving its own `per_rank[rank]` only, and "collectives" is what the grader
saw each rank call (autograder.grading.rank_pool).
"""
from __future__ import annotations

import importlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from .counting import COLLECTIVES
from .ranks import _measured, on_ranks

__all__ = ["on_separate_ranks", "join_and_run", "rank_function"]


def rank_function(path: str):
    """The course's rank function named `path` ("camplib.<module>.<name>")."""
    if not isinstance(path, str) or not path.startswith("camplib."):
        raise ValueError(f"a rank function is named by its camplib path, got {path!r}")
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _pick(rank: int, world_size: int, rank_fn, fn, per_rank: list):
    return rank_fn(rank, world_size, fn, per_rank[rank])


def on_separate_ranks(path: str, fn, per_rank: list, backend: str | None = "gloo", timeout: float = 60.0) -> dict:
    """`rank_function(path)(rank, world_size, fn, per_rank[rank])` on len(per_rank) forked ranks."""
    out = on_ranks(_pick, len(per_rank), rank_function(path), fn, list(per_rank), backend=backend, timeout=timeout)
    out["collectives"] = [sorted(op for op in calls if op in COLLECTIVES and op != "barrier") for calls in out["calls"]]
    return out


def join_and_run(path: str, fn, rank: int, world_size: int, port: int, mine, timeout: float = 30.0) -> dict:
    """One rank of a run whose other ranks are other processes: join the gloo process group whose
    store rank 0 serves on 127.0.0.1:`port`, run the rank function `path` on `mine` inside
    count_bytes, wait for every rank, leave the group. Returns {"returned", "bytes_sent", "calls"}."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", int(port), world_size, is_master=rank == 0, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))
    try:
        measured = _measured(rank, world_size, rank_function(path), (fn, mine))
        dist.barrier()   # rank 0 serves the store: it leaves last
        return measured
    finally:
        dist.destroy_process_group()
