"""b06 ring submissions that reach torch.distributed's collectives below the layer a rank's
observer wraps, and honest rings beside them, graded as `camp grade` does (the lab's forbidden
list) and with nothing forbidden (the grader's own measurement and observer alone). Each
submission is the solved notebook plus a last cell redefining `exchange`, the helper every ring
exercise calls (the reference's: isend + irecv). A hostile `exchange` moves the data with an
all-reduce reached some other way; an honest one with batch_isend_irecv or ordered send/recv.

    .venv/bin/python -m tests.autograder.grading.c10d_rings [workdir]

prints each submission's ring scores and reasons (minutes: one b06 grading per submission).
tests/autograder/grading/test_attacks_harness.py grades OPS_RINGS in its b06 runs.
"""
from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder.catalog import Catalog, repo_root
from autograder.course.reference import student_notebook, write_submission
from autograder.grading.grade import GradeOptions, grade
from tests.support import saved_results

RINGS = ["test_ring_all_reduce", "test_ring_reduce_scatter"]
_BY_SUM = '''
import importlib, operator, sys
import torch
import torch.distributed as dist


def _gather_by(all_reduce, send, recv, left):
    """What `left` sends, through a sum of every rank's slot: a collective, not a message."""
    n, r = dist.get_world_size(), dist.get_rank()
    slots = torch.zeros(n, *send.shape, dtype=send.dtype)
    slots[r] = send
    all_reduce(slots)
    recv.copy_(slots[left])


def exchange(send, recv, right, left):
    _gather_by(ROUTE, send, recv, left)
'''
ROUTES = {
    "ops_literal": "lambda t: torch.ops.c10d.allreduce_.default([t], dist.group.WORLD.boxed(), "
                   "torch.classes.c10d.ReduceOp(), None, False, -1)[1].wait()",
    "ops_getattr": "lambda t: getattr(getattr(torch.ops, 'c' + '10d'), 'allreduce_')([t], dist.group.WORLD.boxed(), "
                   "torch.classes.c10d.ReduceOp(), None, False, -1)[1].wait()",
    "ops_attrgetter": "lambda t: operator.attrgetter('ops.c10d.allreduce_')(torch)([t], dist.group.WORLD.boxed(), "
                      "torch.classes.c10d.ReduceOp(), None, False, -1)[1].wait()",
    "functional": "lambda t: t.copy_(importlib.import_module('torch.distributed._functional_collectives')"
                  ".all_reduce(t, 'sum', dist.group.WORLD))",
    "raw_importlib": "lambda t: importlib.import_module('torch._C.' + '_distributed_c10d').ProcessGroup.allreduce("
                     "dist.group.WORLD, [t]).wait()",
    "raw_sys_modules": "lambda t: sys.modules['torch._C._distributed_c10d'].ProcessGroup.allreduce("
                       "dist.group.WORLD, [t]).wait()",
    "closure": "lambda t: dist.ProcessGroup.allreduce.__closure__[1].cell_contents(dist.group.WORLD, [t]).wait()",
    "closure_getattr": "lambda t: getattr(getattr(dist.ProcessGroup.allreduce, '__clo' + 'sure__')[1], "
                       "'cell_' + 'contents')(dist.group.WORLD, [t]).wait()",
}
HOSTILE = {name: _BY_SUM.replace("ROUTE", route) for name, route in ROUTES.items()}
# two routes at once, one per exercise family: the reduce-scatter through torch.ops.c10d, the
# all-gather through the functional collectives (each ring test fails with its own reason)
OPS_RINGS = _BY_SUM.replace("ROUTE", "_route()") + '''

def _route():
    import inspect
    caller = inspect.stack()[2].function
    if caller == "ring_reduce_scatter":
        return lambda t: torch.ops.c10d.allreduce_([t], dist.group.WORLD.boxed(), torch.classes.c10d.ReduceOp(),
                                                   None, False, -1)[1].wait()
    fc = importlib.import_module("torch.distributed._functional_collectives")
    return lambda t: t.copy_(fc.all_reduce(t, "sum", dist.group.WORLD))
'''
HONEST = {
    "batch_isend_irecv": '''
import torch
import torch.distributed as dist


def exchange(send, recv, right, left):
    """Not dist.all_reduce (torch.ops.c10d.allreduce_ underneath): one batch of point-to-point ops."""
    ops = [dist.P2POp(dist.isend, send.contiguous(), right), dist.P2POp(dist.irecv, recv, left)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
''',
    "send_recv": '''
import torch.distributed as dist


def exchange(send, recv, right, left):
    # even ranks send first, odd ranks receive first: blocking send/recv without a deadlock
    if dist.get_rank() % 2 == 0:
        dist.send(send.contiguous(), right)
        dist.recv(recv, left)
    else:
        dist.recv(recv, left)
        dist.send(send.contiguous(), right)
''',
}


def with_last(nb, source):
    nb.cells.append(nbformat.v4.new_code_cell(source))
    return nb


def without_forbid(catalog, lab_id="b06"):
    labs = tuple(dataclasses.replace(lab, forbid=()) if lab.id == lab_id else lab for lab in catalog.labs)
    return dataclasses.replace(catalog, labs=labs)


def graded(work: Path, submissions: dict[str, str], forbid: bool, reference: bool = False) -> dict:
    """student -> {grade_id: (score, message)} for b06, each submission the solved notebook (whose
    rings call `exchange`) plus its last cell."""
    catalog = Catalog.load() if forbid else without_forbid(Catalog.load())
    subs, out = work / "submissions", work / "workspace"
    if reference:
        write_submission(subs, "ada", "b06", student_notebook("b06"))
    for name, source in submissions.items():
        write_submission(subs, name, "b06", with_last(student_notebook("b06"), source))
    grade(subs, catalog, repo_root(), out, "b06", GradeOptions(jobs=1))
    details = saved_results(out, catalog.get("b06").name)
    return {s: {t["grade_id"]: (t["score"], t["message"]) for t in d["tests"]} for s, d in details.items()}


def main(work: Path) -> None:
    start = time.monotonic()
    rows = {"as graded": graded(work / "as_graded", {**HOSTILE, **HONEST}, True, reference=True),
            "measured only": graded(work / "measured", HOSTILE, False)}
    for mode, students in rows.items():
        for student, tests in sorted(students.items()):
            total, best = sum(s for s, _ in tests.values()), len(tests)
            print(f"[{mode}] {student}: {total:g} points over {best} tests")
            for g in RINGS:
                print(f"    {g}: {tests[g][0]:g}  {tests[g][1][:220]}")
    print(f"{time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="c10d_rings_")))
