"""`camp grade`: autograde a class through nbgrader's API into a sqlite gradebook.

The grading workspace (`--out`) is an nbgrader course folder of its own: source/ holds a copy of
the graded labs' solution notebooks, submitted/ the students' notebooks, autograded/ and
feedback/ what nbgrader writes, gradebook.db the scores. The repository is never written.
One broken submission is reported with its reason and scored 0; the others are still graded.
"""
from __future__ import annotations

import csv
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from .catalog import Catalog, Lab
from .nbgrader_setup import nbgrader_api, nbgrader_config
from .submissions import Submission, collect, copy_plain_files


@dataclass
class GradeRow:
    student: str
    lab: str
    score: float
    max_score: float
    status: str          # graded | error | not submitted
    message: str = ""
    feedback: str = ""


class GradingSetupError(RuntimeError):
    """The grader itself cannot start (missing source, nbgrader refusing the lab)."""


def grade(submissions_dir: Path, catalog: Catalog, root: Path, out: Path, only_lab: str | None = None) -> list[GradeRow]:
    """Grade every submission under `submissions_dir`; write out/grades.csv and feedback."""
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    subs, rejected = collect(submissions_dir, out / "unpacked")
    rows = [GradeRow(r.student, "-", 0.0, 0.0, "error", r.reason) for r in rejected]
    by_lab: dict[str, list[Submission]] = {}
    wanted = catalog.get(only_lab) if only_lab else None
    for sub in subs:
        try:
            lab = catalog.get(sub.lab)
        except KeyError:
            rows.append(GradeRow(sub.student, sub.lab, 0.0, 0.0, "error", f"unknown lab folder {sub.lab!r}"))
            continue
        if wanted and lab.id != wanted.id:
            continue
        if lab.status != "ready":
            rows.append(GradeRow(sub.student, lab.id, 0.0, 0.0, "error", f"lab {lab.id} is not released yet"))
            continue
        by_lab.setdefault(lab.id, []).append(sub)
    if wanted:
        by_lab.setdefault(wanted.id, [])
    students = sorted({s.student for s in subs} | {r.student for r in rejected if r.student})
    for lab_id, lab_subs in by_lab.items():
        rows += _grade_lab(catalog.get(lab_id), lab_subs, students, root, out)
    rows.sort(key=lambda r: (r.student, r.lab))
    write_csv(rows, out / "grades.csv")
    return rows


def _grade_lab(lab: Lab, subs: list[Submission], students: list[str], root: Path, out: Path) -> list[GradeRow]:
    from nbgrader.api import Gradebook, MissingEntry

    config = nbgrader_config(out, cell_timeout=lab.cell_timeout)
    api = nbgrader_api(config)
    _install_source(lab, root, out, api)
    db_url = config.CourseDirectory.db_url
    with Gradebook(db_url) as gb:
        max_score = gb.find_assignment(lab.name).max_score
    rows = []
    submitted = {s.student: s for s in subs}
    for student in students:
        if student not in submitted:
            rows.append(GradeRow(student, lab.id, 0.0, max_score, "not submitted"))
            continue
        dest = out / "submitted" / student / lab.name
        copy_plain_files(submitted[student].path, dest)
        problem = _notebook_problem(dest / lab.notebook, lab)
        result = None if problem else api.autograde(lab.name, student, force=True, create=True)
        if result is not None and not result["success"]:
            problem = "autograding failed: " + _last_error_line(result)
        with Gradebook(db_url) as gb:
            if problem:
                try:  # never leave an older score standing for a submission that now failed
                    gb.remove_submission(lab.name, student)
                except MissingEntry:
                    pass
                rows.append(GradeRow(student, lab.id, 0.0, max_score, "error", problem))
                continue
            score = gb.find_submission(lab.name, student).score
        code_error = first_code_error(out / "autograded" / student / lab.name / lab.notebook)
        feedback = api.generate_feedback(lab.name, student)
        html = out / "feedback" / student / lab.name / lab.notebook.replace(".ipynb", ".html")
        rows.append(GradeRow(student, lab.id, float(score), float(max_score), "graded",
                             "; ".join(m for m in (code_error, "" if feedback["success"] else
                                                    "feedback not generated: " + _last_error_line(feedback)) if m),
                             str(html.relative_to(out)) if html.exists() else ""))
    return rows


def _install_source(lab: Lab, root: Path, out: Path, api) -> None:
    """Copy the lab's solution folder into the workspace and register it in the gradebook."""
    src = lab.source_path(root).parent
    if not src.exists():
        raise GradingSetupError(f"{lab.id}: no source folder {src}")
    copy_plain_files(src, out / "source" / lab.name)
    result = api.generate_assignment(lab.name, force=True, create=True)
    if not result["success"]:
        raise GradingSetupError(f"{lab.id}: nbgrader could not register the lab in {out}: "
                                + _last_error_line(result) + " (use a fresh --out if the lab's source changed)")


def _notebook_problem(path: Path, lab: Lab) -> str | None:
    """Why `path` cannot be graded at all, or None."""
    if not path.exists():
        others = sorted(p.name for p in path.parent.glob("*.ipynb"))
        return f"no {lab.notebook} in the submission" + (f" (found {', '.join(others)})" if others else "")
    try:
        nbformat.validate(nbformat.read(path, as_version=4))
    except Exception as exc:
        return f"{lab.notebook} is not a valid notebook: {str(exc).splitlines()[0][:200]}"
    return None


def first_code_error(notebook: Path) -> str:
    """'In [3]: ModuleNotFoundError: ...' for the first error outside the graded test cells, the
    usual reason a whole notebook scores 0 (a failing import, a syntax error)."""
    try:
        nb = nbformat.read(notebook, as_version=4)
    except Exception:
        return ""
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or (meta.get("grade") and not meta.get("solution")):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                return f"first error in In [{cell.get('execution_count')}]: {output.get('ename')}: {output.get('evalue')}"[:300]
    return ""


def _last_error_line(result: dict) -> str:
    text = (result.get("error") or "") + "\n" + (result.get("log") or "")
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    errors = [l for l in lines if "ERROR" in l or "Error" in l]
    return (errors or lines or ["no message"])[-1][:300]


def write_csv(rows: list[GradeRow], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0]).keys()) if rows else
                                ["student", "lab", "score", "max_score", "status", "message", "feedback"])
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row))
