"""What nbgrader's Formgrader needs to show a submission `camp grade` graded.

Formgrader lists a submission as graded, and opens it for manual grading, only when three
things agree: the gradebook has it (reports.gradebook.record), the workspace holds
autograded/<student>/<lab>/<notebook>.ipynb, and the gradebook's timestamp equals the one in
nbgrader's submitted folder (the workspace's collected/, course.nbgrader_setup.SUBMITTED), i.e.
the timestamp.txt `camp grade` wrote there with the upload it graded
(grading.uploads.turned_in). This module writes the last two: a later collect of a newer
submission then shows as ungraded.

The autograded notebook is built like nbgrader's own (its OverwriteCells step): the student's
cells in the student's order, every graded cell restored from the course's source (metadata,
and the whole test cell, hidden tests included: only the instructor sees this copy), graded
cells the student deleted put back at the end, and each test cell's output replaced by the
grader's verdict. The student's outputs and cell metadata are dropped: Formgrader renders this
notebook in the instructor's browser, so nothing the student wrote is shown as live HTML
(markdown is also sanitized by the config's HTMLExporter.sanitize_html).
"""
from __future__ import annotations

from pathlib import Path

import nbformat

from ..catalog import Lab
from ..course.nbgrader_setup import submission_folder
from ..grading.results import SubmissionResult
from ..grading.uploads.turned_in import read_stamp
from ..grading.uploads.notebooks import parse_notebook
from .gradebook import set_submission_time

MISSING_SOLUTION = "# (this cell was missing from the submission)\n"


def publish_for_formgrader(out: Path, lab: Lab, result: SubmissionResult) -> Path:
    """Write autograded/<student>/<lab>/<notebook> in the workspace `out` and align the
    gradebook's submission time with collected/.../timestamp.txt. Returns the notebook's path."""
    submitted = submission_folder(out, result.student, lab.name)
    source = nbformat.read(out / "source" / lab.name / lab.notebook, as_version=4)
    try:
        student = parse_notebook((submitted / lab.notebook).read_bytes(), lab.notebook)   # metadata repaired
    except Exception:  # unreadable or missing: the graded cells alone, solutions marked missing
        student = None
    dest = out / "autograded" / result.student / lab.name / lab.notebook
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(autograded_notebook(source, student, result), dest)
    set_submission_time(out / "gradebook.db", lab.name, result.student, read_stamp(submitted))
    return dest


def autograded_notebook(source, student, result: SubmissionResult) -> nbformat.NotebookNode:
    """The student's notebook with the course's graded cells and the grader's verdicts."""
    graded = {c.metadata["nbgrader"]["grade_id"]: c for c in source.cells
              if c.metadata.get("nbgrader", {}).get("grade_id")}
    verdicts = {t.grade_id: t for t in result.tests}
    nb = nbformat.v4.new_notebook(metadata=source.metadata)
    seen: set[str] = set()
    for cell in (student.cells if student is not None else []):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in graded:
            if grade_id not in seen:  # a duplicated graded cell counts once, as when grading
                seen.add(grade_id)
                nb.cells.append(_restored(graded[grade_id], cell.get("source", ""), verdicts.get(grade_id)))
        elif cell.get("cell_type") in ("code", "markdown", "raw"):
            nb.cells.append(_plain(cell))
    for grade_id, cell in graded.items():
        if grade_id not in seen:
            nb.cells.append(_restored(cell, None, verdicts.get(grade_id)))
    return nb


def _restored(course_cell, student_source: str | None, verdict) -> nbformat.NotebookNode:
    meta = course_cell.metadata["nbgrader"]
    if meta.get("solution"):  # the student's answer, under the course's metadata
        text = student_source if student_source is not None else MISSING_SOLUTION
    else:                     # tests and locked cells: always the course's own
        text = course_cell.source
    if course_cell.cell_type == "markdown":
        cell = nbformat.v4.new_markdown_cell(text)
    else:
        cell = nbformat.v4.new_code_cell(text)
        if verdict is not None:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=_verdict_text(verdict))]
    cell.metadata["nbgrader"] = dict(meta)
    return cell


def _plain(cell) -> nbformat.NotebookNode:
    text = cell.get("source", "")
    text = "".join(text) if isinstance(text, list) else str(text)
    make = {"code": nbformat.v4.new_code_cell, "markdown": nbformat.v4.new_markdown_cell,
            "raw": nbformat.v4.new_raw_cell}[cell["cell_type"]]
    return make(text)


def _verdict_text(test) -> str:
    head = f"camp grade: {test.grade_id} {test.score:g} / {test.points:g} points"
    return head + ("\n" + test.message if test.message else " (passed)") + "\n"
