"""`camp grade`: grade a class into nbgrader's sqlite gradebook, safely and in parallel.

The workspace (`--out`, made private to the grader) is an nbgrader course of its own: source/
holds a copy of each graded lab's source notebook (registered with nbgrader's
generate_assignment), submitted/ the students' files, results/ one JSON per graded submission,
feedback/ the HTML each student gets, gradebook.db the scores, grades.csv and report.html the
summaries. Each submission runs in its own sandbox (autograder.isolation.sandbox) while the course's
tests run in a clean process (autograder.grading.engine). A finished result is written atomically
and not redone on a later run unless the submission, the lab or `--regrade` says so, so an
interrupted grading run resumes where it stopped.
"""
from __future__ import annotations

import csv
import multiprocessing
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..catalog import Catalog, Lab
from ..course.labspec import LabSpec
from ..course.nbgrader_setup import nbgrader_api, nbgrader_config
from ..isolation.sandbox import Limits, namespaces_available
from ..reports.class_report import write_report
from ..reports.feedback import write_feedback_html
from ..reports.gradebook import record
from .results import SubmissionResult, TestOutcome, load_result, result_key, save_result
from .uploads import Submission, collect, copy_plain_files


@dataclass
class GradeRow:
    student: str
    lab: str
    score: float
    max_score: float
    status: str          # graded | error | not submitted
    message: str = ""
    feedback: str = ""


@dataclass
class GradeOptions:
    jobs: int = 1
    isolation: str = "auto"          # auto | namespace | none
    regrade: bool = False
    limits: Limits = field(default_factory=Limits)
    cell_timeout: float | None = None   # overrides the labs' own cell_timeout (tests use a short one)
    seed: int | None = None             # hidden cases' seed; None: a fresh one for this run


class GradingSetupError(RuntimeError):
    """The grader itself cannot start (missing source, no isolation available...)."""


def resolve_isolation(requested: str) -> str:
    if requested == "none":
        return "none"
    if namespaces_available():
        return "namespace"
    if requested == "namespace":
        raise GradingSetupError("namespace isolation needs root and util-linux `unshare` on Linux")
    raise GradingSetupError(
        "cannot isolate student code here (needs root and util-linux `unshare`). Run `sudo camp grade ...`, "
        "or pass --isolation none to grade without a sandbox: student code could then read the "
        "solutions and write the gradebook")


def grade(submissions_dir: Path, catalog: Catalog, root: Path, out: Path, only_lab: str | None = None,
          options: GradeOptions = GradeOptions()) -> list[GradeRow]:
    """Grade every submission under `submissions_dir`; write grades.csv, report.html, feedback."""
    isolation = resolve_isolation(options.isolation)
    from .engine import new_seed
    seed = new_seed() if options.seed is None else int(options.seed)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    subs, rejected = collect(submissions_dir, out / "unpacked")
    rows = [GradeRow(r.student, "-", 0.0, 0.0, "error", r.reason) for r in rejected]
    by_lab, unknown = _by_lab(subs, catalog, only_lab)
    rows += unknown
    students = sorted({s.student for s in subs} | {r.student for r in rejected})
    hide = [root / "solutions", root / ".git", root / "tests", out, submissions_dir.resolve()]
    results: dict[tuple[str, str], SubmissionResult] = {}
    jobs = []
    scratch_root = Path(tempfile.mkdtemp(prefix="camp-sandboxes-"))
    os.chmod(scratch_root, 0o711)
    for lab_id, lab_subs in by_lab.items():
        lab = catalog.get(lab_id)
        spec = _install_source(lab, root, out)
        submitted = {s.student: s for s in lab_subs}
        for student in students:
            if student not in submitted:
                rows.append(GradeRow(student, lab.id, 0.0, spec.max_score, "not submitted"))
                continue
            dest = out / "submitted" / student / lab.name
            copy_plain_files(submitted[student].path, dest)
            key = result_key(dest, out / "source" / lab.name / lab.notebook)
            cached = None if options.regrade else load_result(out, lab.name, student, key)
            if cached:
                results[(student, lab.id)] = cached
                continue
            jobs.append({"student": student, "lab": lab.id, "lab_name": lab.name, "key": key,
                         "source": str(out / "source" / lab.name / lab.notebook), "submission": str(dest),
                         "lab_files": str(lab.release_path(root).parent),
                         "scratch_root": str(scratch_root), "isolation": isolation, "hide": [str(p) for p in hide],
                         "forbid": list(lab.forbid), "seed": seed, "threads": max(1, (os.cpu_count() or 1) // options.jobs),
                         "limits": {**asdict(options.limits),
                                    "cell_seconds": float(options.cell_timeout or lab.cell_timeout)}})
    for student, lab_id in sorted(results):  # finished in an earlier run
        rows.append(_publish(out, catalog.get(lab_id), results[(student, lab_id)]))
    for job, result in _run_jobs(jobs, options.jobs):  # published while the other jobs still run
        lab = catalog.get(job["lab"])
        save_result(out, lab.name, result, job["key"])
        results[(result.student, lab.id)] = result
        rows.append(_publish(out, lab, result))
    shutil.rmtree(scratch_root, ignore_errors=True)
    rows.sort(key=lambda r: (r.student, r.lab))
    write_csv(rows, out / "grades.csv")
    write_report(list(results.values()), out / "report.html")
    return rows


def _by_lab(subs: list[Submission], catalog: Catalog, only_lab: str | None):
    by_lab: dict[str, list[Submission]] = {}
    problems: list[GradeRow] = []
    wanted = catalog.get(only_lab) if only_lab else None
    for sub in subs:
        try:
            lab = catalog.get(sub.lab)
        except KeyError:
            if not wanted:
                problems.append(GradeRow(sub.student, sub.lab, 0.0, 0.0, "error", f"unknown lab folder {sub.lab!r}"))
            continue
        if wanted and lab.id != wanted.id:
            continue
        if lab.status != "ready":
            problems.append(GradeRow(sub.student, lab.id, 0.0, 0.0, "error", f"lab {lab.id} is not released yet"))
            continue
        by_lab.setdefault(lab.id, []).append(sub)
    if wanted:
        by_lab.setdefault(wanted.id, [])
    return by_lab, problems


def _run_jobs(jobs: list[dict], n: int):
    """Yield (job, result) as submissions finish, `n` at a time, each worker with its own uid slot."""
    if not jobs:
        return
    from .worker import grade_job, init_worker

    ctx = multiprocessing.get_context("spawn")  # workers start clean: no state from this process
    slots = ctx.Queue()
    for slot in range(n):
        slots.put(slot)
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx, initializer=init_worker, initargs=(slots,)) as pool:
        futures = {pool.submit(grade_job, job): job for job in jobs}
        for future in as_completed(futures):
            job = futures[future]
            try:
                yield job, SubmissionResult.from_dict(future.result())
            except Exception as exc:  # the worker itself died: report, don't save, retry next run
                spec = LabSpec.from_notebook(Path(job["source"]))
                yield job, SubmissionResult(job["student"], job["lab"], "error", max_score=spec.max_score,
                                            message=f"grader worker failed ({type(exc).__name__}); run again to retry",
                                            retry=True,
                                            tests=[TestOutcome(t.grade_id, t.points, 0.0, "not graded") for t in spec.tests])


def _install_source(lab: Lab, root: Path, out: Path) -> LabSpec:
    """Copy the lab's source into the workspace and register it in the gradebook."""
    src = lab.source_path(root).parent
    if not src.exists():
        raise GradingSetupError(f"{lab.id}: no source folder {src}")
    copy_plain_files(src, out / "source" / lab.name)
    api = nbgrader_api(nbgrader_config(out))
    result = api.generate_assignment(lab.name, force=True, create=True)
    if not result["success"]:
        raise GradingSetupError(f"{lab.id}: nbgrader could not register the lab in {out} "
                                "(use a fresh --out if the lab's source changed): "
                                + (result.get("error") or result.get("log") or "").strip().splitlines()[-1][:300])
    return LabSpec.from_notebook(out / "source" / lab.name / lab.notebook)


def _publish(out: Path, lab: Lab, result: SubmissionResult) -> GradeRow:
    """Gradebook, feedback HTML and the grade sheet row for one result (idempotent)."""
    spec = LabSpec.from_notebook(out / "source" / lab.name / lab.notebook)
    record(out / "gradebook.db", lab.name, Path(lab.notebook).stem, result)
    html = out / "feedback" / result.student / lab.name / lab.notebook.replace(".ipynb", ".html")
    write_feedback_html(spec, result, out / "submitted" / result.student / lab.name / lab.notebook, html)
    failed = [t for t in result.tests if t.message]
    message = result.message or (result.cell_errors[0] if result.cell_errors and result.score == 0 else "")
    if not message and failed:
        message = "failed: " + ", ".join(t.grade_id for t in failed)
    return GradeRow(result.student, lab.id, result.score, result.max_score, result.status, message[:300],
                    str(html.relative_to(out)))


def write_csv(rows: list[GradeRow], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[f.name for f in GradeRow.__dataclass_fields__.values()])
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
