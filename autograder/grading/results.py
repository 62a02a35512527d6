"""What grading one submission produces (SubmissionResult, one TestOutcome per graded test),
and the store that keeps finished results so an interrupted grading run resumes where it stopped.

A result is saved atomically under results/<lab>/<student>.json with a key that hashes the
submission, the lab's source and the grader's own code: a changed input regrades.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class TestOutcome:
    grade_id: str
    points: float
    score: float
    message: str = ""
    output: str = ""
    seconds: float = 0.0   # wall time of this test (its canaries included)


@dataclass
class SubmissionResult:
    student: str
    lab: str
    status: str                                   # graded | error
    score: float = 0.0
    max_score: float = 0.0
    tests: list[TestOutcome] = field(default_factory=list)
    cell_errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    message: str = ""
    seconds: float = 0.0
    cells_seconds: float = 0.0   # of which: starting the sandbox and running the notebook's cells
    retry: bool = False   # a grader-side failure: not saved, so the next run grades it again
    seed: int | None = None   # the hidden cases' seed of the run that graded it (camp grade --seed)
    sandbox_uid: int | None = None   # the uid the student's code ran as (for the instructor's forensics)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SubmissionResult":
        d = dict(d)
        d["tests"] = [TestOutcome(**t) for t in d.get("tests", [])]
        return cls(**d)


def _grader_fingerprint() -> bytes:
    """Hash of the grader's own code: a changed grader regrades instead of reusing old results."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parents[1].rglob("*.py")):
        h.update(path.read_bytes())
    return h.digest()


def result_key(submission: Path, source: Path) -> str:
    """What a result depends on: the grader, the lab's source and the submission's files (not
    its timestamp.txt: a newer collect of the same files is the same work, graded once)."""
    h = hashlib.sha256(_grader_fingerprint())
    stamp = submission / "timestamp.txt"
    for path in sorted(p for p in submission.rglob("*") if p.is_file() and p != stamp) + [source]:
        h.update(str(path.name).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def result_path(out: Path, lab_name: str, student: str) -> Path:
    return out / "results" / lab_name / f"{student}.json"


def load_result(out: Path, lab_name: str, student: str, key: str) -> SubmissionResult | None:
    try:
        data = json.loads(result_path(out, lab_name, student).read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != key:
        return None
    return SubmissionResult.from_dict(data["result"])


def save_result(out: Path, lab_name: str, result: SubmissionResult, key: str) -> None:
    if result.retry:
        return
    path = result_path(out, lab_name, result.student)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "result": result.to_dict()}, indent=1))
    os.replace(tmp, path)  # atomic: a crash leaves the old result or the new one, never half
