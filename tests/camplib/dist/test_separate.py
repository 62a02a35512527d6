"""camplib.dist.separate.join_and_run as the grader's rank sandboxes call it: one process per
rank, one join per run, each run on a fresh port (autograder.grading.rank_pool)."""
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from camplib.dist import on_ranks
from camplib.dist.separate import join_and_run
from tests.support import free_port


def _sum(t):
    dist.all_reduce(t)
    return t


def _failed_join_then_a_run(rank, world_size, ports):
    """Run 1: rank 1 joins a store whose rank 0 never joins, so its init_process_group fails half-way
    (as when the other rank's rank function raised and it left while gloo still connected this
    one). Run 2: both ranks join on a fresh port and sum their inputs."""
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", ports[0], 2, is_master=True, wait_for_workers=False)
        store.wait(["failed"], timedelta(seconds=30))
        first = "served"
    else:
        try:
            join_and_run("camplib.dist.harness.collective_rank", _sum, 1, 2, ports[0], torch.ones(2), timeout=1)
            first = "joined"
        except Exception as exc:  # noqa: BLE001 - what the grader would receive
            first = type(exc).__name__
        dist.TCPStore("127.0.0.1", ports[0], 2, is_master=False).set("failed", "1")
    began = time.monotonic()
    try:
        got = join_and_run("camplib.dist.harness.collective_rank", _sum, rank, 2, ports[1],
                           torch.full((2,), rank + 1.0), timeout=10)["returned"]["outputs"].tolist()
    except Exception as exc:  # noqa: BLE001
        got = f"{type(exc).__name__}: {str(exc)[:200]}"
    return {"first": first, "second": got, "seconds": time.monotonic() - began}


def test_a_join_that_failed_half_way_leaves_the_next_run_unharmed():
    # before the fix, torch's count of groups stayed 1 on rank 1 after its failed join: it named its
    # next group "1", rank 0 "0", and both waited for the other's keys until the timeout (60 s in a02)
    out = on_ranks(_failed_join_then_a_run, 2, [free_port(), free_port()], timeout=30)
    assert out["first"] == ["served", "DistStoreError"], out
    assert out["second"] == [[3.0, 3.0]] * 2, out
    assert max(out["seconds"]) < 9, out   # under its 10 s timeout (~0.3 s idle): no wait for a missing key
