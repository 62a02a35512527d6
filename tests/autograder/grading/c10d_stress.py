"""Deadlock check for the collectives' observer of rank sandboxes (autograder.grading.observe,
collective_ops): on 2, 3 and 4 gloo ranks, each wires every layer (ProcessGroup, Backend, the op
namespaces' proxies) with a real Reporter, then floods gloo's work queue with async collectives
through each route (torch.ops.c10d.allreduce_.default, dist.all_reduce, the backend's broadcast,
the functional all-reduce), tensors freed while queued: the situation in which Python kernels at
the dispatcher deadlocked. Each run ends in seconds or the launch's 90 s timeout says otherwise.

    .venv/bin/python -m tests.autograder.grading.c10d_stress [repeats]
"""
import sys
import time

import torch
import torch.distributed as dist

from camplib.dist.ranks import on_ranks
from autograder.grading.observe import Reporter, report_channel, wire_collectives


def rank_fn(rank, world_size, iters):
    grader, student = report_channel()
    wire_collectives(Reporter(student.detach()))
    pg = dist.group.WORLD
    functional = torch.ops._c10d_functional
    total = 0.0
    for i in range(iters):
        works = []
        for _ in range(8):   # many in flight: enqueue waits on the worker while tensors die
            t = torch.full((1024,), float(rank + 1))
            works.append(torch.ops.c10d.allreduce_.default([t], pg.boxed(), torch.classes.c10d.ReduceOp(), None, True, -1)[1])
            works.append(dist.all_reduce(torch.ones(256), async_op=True))
            works.append(pg._get_backend(torch.device("cpu")).broadcast([torch.ones(64)]))
        z = functional.wait_tensor(functional.all_reduce(torch.ones(32), "sum", pg.group_name))
        for w in works:
            w.wait()
        total += float(z[0])
    n = 0
    while True:   # what reached the grader's end
        try:
            n += len(grader.recv(4096, 0x40))
        except BlockingIOError:
            break
    return {"total": total, "reported_bytes": n}


if __name__ == "__main__":
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for n in (2, 3, 4):
        for rep in range(repeats):
            t0 = time.time()
            out = on_ranks(rank_fn, n, 30, backend="gloo", timeout=30, run_timeout=90)
            print(f"world {n} run {rep}: {time.time() - t0:.1f} s, total {out['total']}, reports {out['reported_bytes']}", flush=True)
