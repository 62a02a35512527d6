"""What one grading worker process does for one submission (run in a process pool so that
submissions are graded in parallel and a grader-side failure stays with its submission)."""
from __future__ import annotations

import secrets
import shutil
from pathlib import Path

from ..course.labspec import LabSpec
from ..isolation.sandbox import Limits, Sandbox
from .engine import grade_submission
from .results import SubmissionResult, TestOutcome
from .uploads import copy_plain_files

_slot = 0


def init_worker(slots) -> None:
    """Take a slot number: it picks this worker's sandbox uid, so parallel sandboxes never share one."""
    import os
    global _slot
    _slot = slots.get()
    os.environ.setdefault("MPLBACKEND", "Agg")


def grade_job(job: dict) -> dict:
    spec = LabSpec.from_notebook(Path(job["source"]))
    scratch = Path(job["scratch_root"]) / secrets.token_hex(8)
    try:
        copy_plain_files(Path(job["lab_files"]), scratch)           # data the lab ships (public)
        for nb in scratch.glob("*.ipynb"):
            nb.unlink()
        copy_plain_files(Path(job["submission"]), scratch, replace=False)
        sandbox = Sandbox(scratch, isolation=job["isolation"], slot=_slot, hide=[Path(p) for p in job["hide"]],
                          limits=Limits(**job["limits"]), forbid=job["forbid"], threads=job["threads"])
        result = grade_submission(spec, scratch / spec.notebook, job["student"], job["lab"], sandbox, job["forbid"],
                                  seed=job.get("seed"))
    except Exception as exc:  # a grader bug must not take the class down: report it for this submission
        result = SubmissionResult(job["student"], job["lab"], "error", max_score=spec.max_score,
                                  message=f"grader error: {type(exc).__name__}: {exc}", retry=True,
                                  tests=[TestOutcome(t.grade_id, t.points, 0.0, "not graded") for t in spec.tests])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result.to_dict()
