"""What one grading worker process does for one submission (run in a process pool so that
submissions are graded in parallel and a grader-side failure stays with its submission)."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

import torch

from ..course.labspec import LabSpec
from ..isolation.sandbox import Limits, Sandbox
from ..isolation.uids import UidLease
from .engine import grade_submission, warm_up
from .results import SubmissionResult, TestOutcome
from .uploads import copy_plain_files, remove_tree

_lease: UidLease | None = None
_lease_error: Exception | None = None


def init_worker(isolation: str, threads: int = 1, warm: list[tuple[str, list[str]]] = ()) -> None:
    """Lease this worker's sandbox uid for its whole life (no other worker, and no other
    `camp grade` on this machine, gets it while this process lives), use this worker's share of
    the cores, and do the first-use work of each lab to grade now (autograder.grading.pool)."""
    global _lease, _lease_error
    os.environ.setdefault("MPLBACKEND", "Agg")
    torch.set_num_threads(max(1, int(threads)))
    if isolation != "none":
        try:
            _lease = UidLease()
        except Exception as exc:  # reported on each job of this worker, not as a broken pool
            _lease_error = exc
    for source, forbid in warm:
        try:
            warm_up(LabSpec.from_notebook(Path(source)), forbid)
        except Exception:  # only a head start: grading the lab does the same work and reports
            pass


def ready() -> int:
    """A task that returns once this worker is started and warm."""
    return os.getpid()


def grade_job(job: dict) -> dict:
    """Grade one submission; {"result": SubmissionResult dict, "starved": bool}. `starved`: a
    timeout happened while the sandbox got little CPU, so it deserves a run alone."""
    spec = LabSpec.from_notebook(Path(job["source"]))
    job_dir = Path(job["scratch_root"]) / secrets.token_hex(8)   # root-only; the student never writes it
    staging = job_dir / "in"
    starved = False
    try:
        if _lease_error is not None:
            raise _lease_error
        copy_plain_files(Path(job["lab_files"]), staging)           # data the lab ships (public)
        for nb in staging.glob("*.ipynb"):
            nb.unlink()
        copy_plain_files(Path(job["submission"]), staging, replace=False)
        sandbox = Sandbox(staging, isolation=job["isolation"], uid=_lease.uid if _lease else None,
                          limits=Limits(**job["limits"]), forbid=job["forbid"], threads=job["threads"],
                          log=job_dir / "student.log", hide=tuple(job.get("hide", ())))
        result = grade_submission(spec, staging / spec.notebook, job["student"], job["lab"], sandbox, job["forbid"],
                                  seed=job.get("seed"))
        starved = sandbox.starved
        result.sandbox_uid = sandbox.uid if job["isolation"] != "none" else None
    except Exception as exc:  # a grader bug must not take the class down: report it for this submission
        result = SubmissionResult(job["student"], job["lab"], "error", max_score=spec.max_score,
                                  message=f"grader error: {type(exc).__name__}: {exc}", retry=True,
                                  tests=[TestOutcome(t.grade_id, t.points, 0.0, "not graded") for t in spec.tests])
    finally:
        try:   # iterative: student code may have left a tree thousands of levels deep
            remove_tree(job_dir)
        except OSError:
            pass
    return {"result": result.to_dict(), "starved": starved}
