"""`camp grade`: grade a class into nbgrader's sqlite gradebook, safely and in parallel.

The workspace (`--out`, made private to the grader) is an nbgrader course of its own: source/
holds a copy of each graded lab's source notebook (registered with nbgrader's
generate_assignment), collected/ the students' files (nbgrader's "submitted" folder, where its
collect writes too: each graded upload's checked copy with its timestamp.txt, so Formgrader
counts and dates what was graded), results/ one JSON per graded submission,
feedback/ the HTML each student gets, gradebook.db the scores, grades.csv and report.html the
summaries, similarity.html and .csv the code-similarity flags (autograder.reports.similarity: for
the instructor to look at, never a score). Each submission runs in its own sandbox
(autograder.isolation.sandbox) while the course's tests run in a clean process
(autograder.grading.engine). A finished result is written atomically and not redone on a later run
unless the submission, the lab or `--regrade` says so, so an interrupted grading run resumes where
it stopped.

Uploads are read first (autograder.grading.uploads, under the course's `[grading]` caps): a
malformed one is that student's 0 with its reason, published like any result. grades.csv
(autograder.reports.grades_csv) and report.html are written whatever happens; rows whose status
is "grader error" are the grader's failures, and make `camp grade` exit non-zero. A row's message
is why the submission lost points (autograder.reports.reasons), the same in the printed table,
grades.csv and report.html.
"""
from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..catalog import Catalog, GradingCaps, Lab
from ..course.labspec import LabSpec
from ..course.nbgrader_setup import SUBMITTED, nbgrader_api, nbgrader_config, submission_folder
from ..isolation.course_tree import hidden_modules
from ..isolation.sandbox import Limits
from ..reports.class_report import write_report
from ..reports.feedback import copy_release_keys, write_feedback_html
from ..reports.formgrader import publish_for_formgrader
from ..reports.gradebook import record
from ..reports.grades_csv import GRADER_ERROR, GradeRow, write_grades_csv
from ..reports.reasons import lost_points
from ..reports.similarity import write_similarity
from ..text import html_text, inert
from .readiness import GradingSetupError, resolve_isolation
from .pool import GradingPool
from .results import SubmissionResult, TestOutcome, load_result, result_key, save_result
from .uploads import Rejected, Submission, collect, copy_plain_files, remove_tree, share_with_group
from .uploads.turned_in import record_turned_in

__all__ = ["GradeOptions", "GradeRow", "grade"]


@dataclass
class GradeOptions:
    jobs: int = 1
    isolation: str = "auto"          # auto | bwrap (old name: namespace) | none
    regrade: bool = False
    limits: Limits = field(default_factory=Limits)
    cell_timeout: float | None = None   # overrides the labs' own cell_timeout (tests use a short one)
    seed: int | None = None             # hidden cases' seed; None: a fresh one for this run
    on: str = "local"                   # local: `jobs` worker processes here; slurm: one job array,
    slurm: object = None                # `jobs` tasks at once (autograder.grading.slurm.SlurmOptions)


def grade(submissions_dir: Path, catalog: Catalog, root: Path, out: Path, only_lab: str | None = None,
          options: GradeOptions = GradeOptions()) -> list[GradeRow]:
    """Grade every submission under `submissions_dir`; write grades.csv, report.html, feedback.

    A submission's failure (a bad upload, a grader bug on it) is that submission's row; whatever
    stops the run midway, grades.csv and report.html are written with what is known, and the
    submissions left unfinished are listed as grader errors."""
    isolation = resolve_isolation(options.isolation)
    from .engine import new_seed
    seed = new_seed() if options.seed is None else int(options.seed)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    shared = os.stat(out).st_mode & (stat.S_ISGID | 0o070) if os.stat(out).st_mode & stat.S_ISGID else 0
    os.chmod(out, 0o700 | shared)   # private: to the grader, or to the group sharing it (make hub's instructors)
    run = _Run(out, catalog.caps, root)
    scratch_root = pool = None
    try:
        subs, rejected = collect(submissions_dir, out / "unpacked", catalog.caps)
        by_lab, unknown = _by_lab(subs, catalog, only_lab)
        share = _share(options)
        if any(by_lab.values()):   # workers warm up while the labs are registered and uploads copied
            warm = [(str(catalog.get(lab_id).source_path(root)), list(catalog.get(lab_id).forbid))
                    for lab_id, lab_subs in by_lab.items() if lab_subs]
            pool = _pool(out, options, isolation, share, warm)
        for row in unknown:
            run.add(row)
        in_lab, whole = _sort_rejections(rejected, catalog, only_lab, run)
        students = sorted({s.student for s in subs} | {r.student for r in rejected if r.valid_id})
        jobs = []
        attached: set[str] = set()   # students whose whole-upload rejection is in a lab's row
        scratch_root = Path(tempfile.mkdtemp(prefix="camp-sandboxes-"))   # 0700: the grader's only
        for lab_id, lab_subs in by_lab.items():
            lab = catalog.get(lab_id)
            spec = _install_source(lab, root, out)
            submitted = {s.student: s for s in lab_subs}
            for student in students:
                reason = in_lab.get((student, lab.id))
                if not reason and student not in submitted and student in whole:
                    reason = whole[student]
                    attached.add(student)
                if reason:
                    _keep_rejected(out, submissions_dir, student, lab)
                    run.publish(lab, _rejected_result(student, lab, spec, reason))
                    continue
                if student not in submitted:
                    run.add(GradeRow(student, lab.id, 0.0, spec.max_score, "not submitted"))
                    continue
                run.pending[(student, lab.id)] = spec.max_score
                try:
                    job = _prepare(out, root, lab, submitted[student], submissions_dir, options, isolation,
                                   scratch_root, share, seed)
                except Exception as exc:  # a grader-side failure on this submission only
                    run.add(GradeRow(student, lab.id, 0.0, spec.max_score, GRADER_ERROR,
                                     f"could not prepare the submission: {type(exc).__name__}: {exc}"))
                    continue
                if isinstance(job, SubmissionResult):  # finished in an earlier run
                    run.publish(lab, job)
                else:
                    jobs.append(job)
        for student, reason in sorted(whole.items()):
            if student in attached:
                continue
            run.add(GradeRow(student, "", 0.0, 0.0, "error", reason))
        crowded = []
        for job, result, starved in (pool.run(jobs) if jobs else ()):  # published while others run
            if starved and options.jobs > 1:
                crowded.append(job)   # timed out while short of CPU: graded again alone before it counts
                continue
            run.finish(catalog.get(job["lab"]), job, result)
        for job in crowded:   # one at a time: the other workers stay idle
            for job, result, _ in pool.run([job]):
                run.finish(catalog.get(job["lab"]), job, result)
    except BaseException as exc:
        for (student, lab_id), max_score in sorted(run.pending.items()):
            run.add(GradeRow(student, lab_id, 0.0, max_score, GRADER_ERROR,
                             f"grading stopped before this submission finished: {type(exc).__name__}: {exc}"))
        raise
    finally:
        if pool is not None:
            pool.close()
        for cleanup in (scratch_root, out / "unpacked"):
            try:
                if cleanup:
                    remove_tree(cleanup)
            except OSError:
                pass
        run.write_summaries()
        share_with_group(out)   # make hub: what root wrote stays usable by the instructors sharing the workspace
    return run.rows


class _Run:
    """The rows of one grading run and the outputs made from them (grade sheet, report)."""

    def __init__(self, out: Path, caps: GradingCaps, root: Path | None = None):
        self.out, self.caps, self.root = out, caps, root
        self.labs: dict[str, Lab] = {}
        self.rows: list[GradeRow] = []
        self.results: dict[tuple[str, str], SubmissionResult] = {}
        self.pending: dict[tuple[str, str], float] = {}   # (student, lab id) -> max score, not yet in rows

    def add(self, row: GradeRow) -> None:
        self.pending.pop((row.student, row.lab), None)
        self.rows.append(row)

    def publish(self, lab: Lab, result: SubmissionResult) -> None:
        """Gradebook, feedback and row for one result; a failure here is a grader error row."""
        try:
            row = _publish(self.out, lab, result, self.caps)
            self.results[(result.student, lab.id)] = result
            self.labs[lab.id] = lab
        except Exception as exc:
            row = GradeRow(result.student, lab.id, 0.0, result.max_score, GRADER_ERROR,
                           f"publishing the result failed: {type(exc).__name__}: {exc}")
        self.add(row)

    def finish(self, lab: Lab, job: dict, result: SubmissionResult) -> None:
        """Save a freshly graded result (so a later run resumes after it), then publish it."""
        try:
            save_result(self.out, lab.name, result, job["key"])
        except OSError as exc:
            result.notes.append(f"grader: the result could not be saved ({exc.strerror}); it is regraded next run")
        self.publish(lab, result)

    def write_summaries(self) -> None:
        self.rows.sort(key=lambda r: (r.student, r.lab))
        write_grades_csv(self.rows, self.out / "grades.csv")
        try:
            write_report(self.rows, list(self.results.values()), self.out / "report.html")
        except Exception as exc:  # the grade sheet is written; say why the report is not
            (self.out / "report.html").write_text(
                "<!doctype html><meta charset='utf-8'><title>LLM Camp grading report</title>"
                f"<p>The report could not be drawn ({html_text(type(exc).__name__)}: {html_text(exc, 300)}); "
                "grades.csv is complete.</p>")
        self.write_similarity()

    def write_similarity(self) -> None:
        """similarity.html/.csv for this run's submissions: flags for a person, never a score."""
        try:
            labs = {lab_id: (lab, LabSpec.from_notebook(self.out / "source" / lab.name / lab.notebook),
                             [s for s, l in self.results if l == lab_id]) for lab_id, lab in self.labs.items()}
            write_similarity(self.out, self.root, labs, self.caps)
        except Exception as exc:  # grading is done and recorded; say why there is no comparison
            (self.out / "similarity.csv").unlink(missing_ok=True)
            (self.out / "similarity.html").write_text(
                "<!doctype html><meta charset='utf-8'><title>LLM Camp code similarity</title>"
                f"<p>The code-similarity report could not be made ({html_text(type(exc).__name__)}: "
                f"{html_text(exc, 300)}); grades are not affected.</p>")


def _sort_rejections(rejected: list[Rejected], catalog: Catalog, only_lab: str | None, run: _Run):
    """Rejections inside a lab folder keyed by (student, lab id), rejections of whole uploads by
    student; invalid ids and folders of unknown labs become rows right away."""
    in_lab: dict[tuple[str, str], str] = {}
    whole: dict[str, str] = {}
    wanted = catalog.get(only_lab).id if only_lab else None
    for r in rejected:
        if not r.valid_id:
            run.add(GradeRow(r.student, "", 0.0, 0.0, "error", r.reason))
        elif not r.lab:
            if r.student in whole:
                run.add(GradeRow(r.student, "", 0.0, 0.0, "error", r.reason))
            else:
                whole[r.student] = r.reason
        else:
            try:
                lab = catalog.get(r.lab)
            except KeyError:
                if not wanted:
                    run.add(GradeRow(r.student, inert(r.lab, 80), 0.0, 0.0, "error",
                                     f"unknown lab folder {inert(r.lab, 80)!r}: {r.reason}"))
                continue
            if wanted and lab.id != wanted:
                continue
            if lab.status != "ready":
                run.add(GradeRow(r.student, lab.id, 0.0, 0.0, "error", f"lab {lab.id} is not released yet"))
                continue
            in_lab[(r.student, lab.id)] = r.reason
    return in_lab, whole


def _rejected_result(student: str, lab: Lab, spec: LabSpec, reason: str) -> SubmissionResult:
    return SubmissionResult(student, lab.id, "error", max_score=spec.max_score, message=reason,
                            tests=[TestOutcome(t.grade_id, t.points, 0.0, "not graded: the upload was rejected")
                                   for t in spec.tests])


def _keep_rejected(out: Path, submissions_dir: Path, student: str, lab: Lab) -> None:
    """The workspace's trace of a rejected upload: only its timestamp.txt (so Formgrader counts
    and dates it; never an older upload's files), unless the upload is the workspace's own
    collected copy (`camp grade <workspace>/collected`), which stays as nbgrader collected it."""
    folder = submission_folder(out, student, lab.name)
    if Path(submissions_dir).resolve() != (out / SUBMITTED).resolve():
        remove_tree(folder)
    try:
        record_turned_in(folder, submissions_dir, student, (lab.id, lab.name))
    except OSError:   # no time to show (Formgrader says None): the rejection itself is still published
        pass


def _prepare(out: Path, root: Path, lab: Lab, sub: Submission, submissions_dir: Path, options: GradeOptions,
             isolation: str, scratch_root: Path, share: dict, seed: int) -> dict | SubmissionResult:
    """Copy one checked submission into the workspace, with the time it was turned in: its
    cached result if still valid, else its job."""
    dest = submission_folder(out, sub.student, lab.name)
    copy_plain_files(sub.path, dest)
    record_turned_in(dest, submissions_dir, sub.student, (sub.lab,))
    key = result_key(dest, out / "source" / lab.name / lab.notebook)
    cached = None if options.regrade else load_result(out, lab.name, sub.student, key)
    if cached:
        return cached
    return {"student": sub.student, "lab": lab.id, "lab_name": lab.name, "key": key,
            "source": str(out / "source" / lab.name / lab.notebook), "submission": str(dest),
            "lab_files": str(lab.release_path(root).parent),
            "scratch_root": str(scratch_root), "isolation": isolation,
            "forbid": list(lab.forbid), "seed": seed, "threads": share["threads"],
            "hide": list(hidden_modules(lab.forbid, out / "source" / lab.name / lab.notebook, lab.notes)),
            "limits": {**asdict(options.limits), "cpus": share["cpus"], "memory_mb": share["memory_mb"],
                       "cell_seconds": float(options.cell_timeout or lab.cell_timeout)}}


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


def _pool(out: Path, options: GradeOptions, isolation: str, share: dict, warm: list):
    """Where the jobs run: `jobs` warm workers here, or a Slurm job array with `jobs` tasks at once."""
    if options.on == "local":
        return GradingPool(options.jobs, isolation, share["threads"], warm)
    if options.on != "slurm":
        raise GradingSetupError(f"unknown place to grade {options.on!r} (local or slurm)")
    from .slurm import SlurmOptions, SlurmPool
    return SlurmPool(out, options.jobs, options.slurm or SlurmOptions(), share["memory_mb"])


def _share(options: GradeOptions) -> dict:
    """Each of the `jobs` sandboxes gets an equal slice of the machine: cores (cgroup quota and
    torch/OpenMP threads) and memory (at most the configured limit). On Slurm each task has its
    own allocation: `cpus_per_task` cores and the configured memory."""
    if options.on == "slurm":
        cpus = getattr(options.slurm, "cpus_per_task", 1)
        return {"cpus": float(cpus), "threads": cpus, "memory_mb": options.limits.memory_mb}
    cores = os.cpu_count() or 1
    try:
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):
        total_mb = options.limits.memory_mb * options.jobs
    return {"cpus": cores / options.jobs, "threads": _threads(max(1, cores // options.jobs)),
            "memory_mb": int(min(options.limits.memory_mb, total_mb * 0.9 // options.jobs))}


def _threads(share: int) -> int:
    """Torch/OpenMP threads of each sandbox and grading worker: its share of the cores, at most the
    caller's OMP_NUM_THREADS when that is set. The test suite sets 1: its two workers already keep
    both cores busy, and OpenMP threads spinning for a core another process holds make torch
    several times slower (tests/conftest.py)."""
    try:
        cap = int(os.environ.get("OMP_NUM_THREADS", ""))
    except ValueError:
        return share
    return min(share, cap) if cap > 0 else share


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


def _publish(out: Path, lab: Lab, result: SubmissionResult, caps: GradingCaps) -> GradeRow:
    """Gradebook, feedback HTML and the grade sheet row for one result (idempotent)."""
    spec = LabSpec.from_notebook(out / "source" / lab.name / lab.notebook)
    record(out / "gradebook.db", lab.name, Path(lab.notebook).stem, result)
    publish_for_formgrader(out, lab, result)
    html = out / "feedback" / result.student / lab.name / lab.notebook.replace(".ipynb", ".html")
    write_feedback_html(spec, result, submission_folder(out, result.student, lab.name) / lab.notebook, html, caps,
                        feedback_root=out / "feedback")
    copy_release_keys(submission_folder(out, result.student, lab.name), html.parent)
    status = GRADER_ERROR if result.retry else result.status
    return GradeRow(result.student, lab.id, result.score, result.max_score, status, lost_points(result),
                    str(html.relative_to(out)))
