"""Ranks that are separate processes started by someone else, each handed only its own input:
how the grader runs a distributed test (autograder.checks.separate_ranks), so that a rank's
correct output proves that data travelled between the ranks.

    out = on_separate_ranks("camplib.dist.harness.collective_rank", fn, per_rank)

gives on_ranks' format ({key: [per rank], "bytes_sent": [...], "calls": [...]}) of
`rank_fn(rank, world_size, fn, per_rank[rank])` on len(per_rank) ranks, plus "collectives": per
rank, the sorted names of the torch.distributed collectives called (barriers aside), and
"resident_bytes": per rank, the memory it held at each pause (below). Here (a notebook, a test)
the ranks are forked by `on_ranks` and those two come from the ranks themselves; during grading
the grader starts one sandbox per rank, each joining the process group with `join_and_run` and
receiving its own `per_rank[rank]` only, and they are what the grader saw each rank call and
measured it hold, from outside (autograder.grading.rank_pool).

A rank function that is a generator pauses at each `yield` (between two optimizer steps, say):
the rank's garbage is collected and its freed heap given back to the system (`settle`), and
its resident memory is measured there, so that a test can tell what a rank keeps from one step
to the next (a02: sharded optimizer state, freed gradients). During grading each pause is the
end of one request to the rank's sandbox: the grader reads the memory of every process in it
and of its writable tmpfs while the rank waits for `resume()`.
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import inspect
import os
from contextlib import ExitStack
from datetime import timedelta

import torch
import torch.distributed as dist

from .counting import COLLECTIVES, count_bytes
from .ranks import _checked, _quiet, on_ranks

__all__ = ["on_separate_ranks", "join_and_run", "resume", "rank_function", "run_through", "settle", "resident_bytes"]


def rank_function(path: str):
    """The course's rank function named `path` ("camplib.<module>.<name>")."""
    if not isinstance(path, str) or not path.startswith("camplib."):
        raise ValueError(f"a rank function is named by its camplib path, got {path!r}")
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


M_MMAP_THRESHOLD = -3   # glibc's mallopt parameter (fixing it also stops its dynamic growth)


def settle() -> None:
    """Collect garbage and give the heap's free pages back to the system (glibc's malloc_trim),
    so that resident memory is what the process still holds, not what it once allocated."""
    gc.collect()
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(M_MMAP_THRESHOLD, 1 << 20)   # from now on, every block of 1 MiB or more is
        libc.malloc_trim(0)                       # mapped alone and unmapped when freed
    except (OSError, AttributeError):   # not glibc: freed memory may stay resident
        pass


def resident_bytes(pid: int | str = "self") -> int:
    """The process's resident memory that holds data (bytes): its anonymous pages and shared
    memory (tmpfs, /dev/shm) from /proc/<pid>/status, not the pages of the libraries' code it
    has run so far (RssFile), which grows with what was first called, not with what is kept."""
    held = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                held += int(line.split()[1]) * 1024
    return held


def run_through(run, at_pause=None):
    """What the generator `run` returns, run to its end, `at_pause()` called at each of its pauses
    (none: the pauses are ignored)."""
    while True:
        try:
            next(run)
        except StopIteration as stop:
            return stop.value
        if at_pause is not None:
            at_pause()


def _pick(rank: int, world_size: int, rank_fn, fn, per_rank: list):
    run, held = rank_fn(rank, world_size, fn, per_rank[rank]), []
    if not inspect.isgenerator(run):
        return _with_memory(run, held)

    def measure():
        settle()
        held.append(resident_bytes())
    return _with_memory(run_through(run, measure), held)


def _with_memory(returned, held: list):
    return {**returned, "resident_bytes": held} if isinstance(returned, dict) else returned


def on_separate_ranks(path: str, fn, per_rank: list, backend: str | None = "gloo", timeout: float = 60.0) -> dict:
    """`rank_function(path)(rank, world_size, fn, per_rank[rank])` on len(per_rank) forked ranks."""
    out = on_ranks(_pick, len(per_rank), rank_function(path), fn, list(per_rank), backend=backend, timeout=timeout)
    out["collectives"] = [sorted(op for op in calls if op in COLLECTIVES and op != "barrier") for calls in out["calls"]]
    return out


_running: dict = {}   # the run a rank is in between join_and_run and its end (one per process)


def join_and_run(path: str, fn, rank: int, world_size: int, port: int, mine, timeout: float = 30.0) -> dict:
    """One rank of a run whose other ranks are other processes: join the gloo process group whose
    store rank 0 serves on 127.0.0.1:`port`, run the rank function `path` on `mine` inside
    count_bytes, wait for every rank, leave the group. Returns {"returned", "bytes_sent", "calls"};
    {"paused": True} where a generator rank function yields (call `resume()` to go on)."""
    _leave()   # a run a failed test left paused
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", int(port), world_size, is_master=rank == 0, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))
    # every rank connected before any runs the rank function: one whose rank function raises leaves at once,
    dist.barrier()   # and must not close its pair while another rank is still connecting (that join would fail)
    counting = ExitStack()
    try:
        _quiet()
        counter = counting.enter_context(count_bytes())
        rank_fn = rank_function(path)
        _running.update(run=rank_fn(rank, world_size, fn, mine), counting=counting, counter=counter, rank_fn=rank_fn,
                        rank=rank)
    except BaseException:
        counting.close()
        dist.destroy_process_group()
        raise
    return resume()


def resume() -> dict:
    """Go on with the run `join_and_run` started, to its next pause or its end."""
    if not _running:
        raise RuntimeError("no rank function is running here")
    run = _running["run"]
    try:
        if inspect.isgenerator(run):
            try:
                next(run)
            except StopIteration as stop:
                run = stop.value
            else:
                settle()
                return {"paused": True}
        _running["counting"].close()
        measured = _checked(run, _running["rank_fn"], _running["rank"], _running["counter"])
        dist.barrier()   # rank 0 serves the store: it leaves last
        return measured
    finally:
        if not inspect.isgenerator(run):
            _leave()
        elif inspect.getgeneratorstate(run) == inspect.GEN_CLOSED:   # it raised
            _leave()


def _leave() -> None:
    if _running:
        run = _running.pop("run")
        _running.pop("counting").close()
        _running.clear()
        if inspect.isgenerator(run):
            run.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    # torch names the default group by a per-process count of the groups made ("0" in a fresh
    # process), reset only when a default group is destroyed: a join whose init_process_group
    # raised (here, when the other rank's rank function raised and it left while gloo still
    # connected this rank) counted a group it never made, so this rank's next group would be "1"
    # while the others' is "0", and each would wait for the other's keys under its own name until
    # the timeout. No group is left here: the next join names its group as a fresh process does.
    dist.distributed_c10d._world.group_count = 0
