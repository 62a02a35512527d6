"""Per-student feedback HTML: the student's notebook with every graded test cell replaced by its
visible part (as released) followed by the grader's verdict. Hidden test source never appears;
hidden test messages do, because they tell the student what to fix."""
from __future__ import annotations

import functools
from html import escape
from pathlib import Path

import nbformat

from ..course.labspec import LabSpec
from ..grading.results import SubmissionResult


def feedback_notebook(spec: LabSpec, result: SubmissionResult, student_nb) -> nbformat.NotebookNode:
    by_id = {t.grade_id: t for t in result.tests}
    visible = {t.grade_id: t.visible_source for t in spec.tests}
    nb = nbformat.v4.new_notebook(metadata=student_nb.metadata if student_nb is not None else {})
    nb.cells.append(nbformat.v4.new_markdown_cell(_summary(result)))
    shown: set[str] = set()
    for cell in (student_nb.cells if student_nb is not None else []):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in visible:
            if grade_id in shown:
                continue
            shown.add(grade_id)
            nb.cells.append(_verdict_cell(visible[grade_id], by_id[grade_id]))
        elif cell.cell_type == "code":
            nb.cells.append(nbformat.v4.new_code_cell(cell.source))
        elif cell.cell_type == "markdown":
            nb.cells.append(nbformat.v4.new_markdown_cell(cell.source))
    for grade_id in visible:  # tests the student deleted still get their verdict
        if grade_id not in shown:
            nb.cells.append(_verdict_cell(visible[grade_id], by_id[grade_id]))
    return nb


def _verdict_cell(source: str, test) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    verdict = (f"PASSED {test.grade_id}: {test.score:g} / {test.points:g} points" if not test.message else
               f"FAILED {test.grade_id}: {test.score:g} / {test.points:g} points\n{test.message}")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(test.output or "") + verdict + "\n")]
    return cell


def _summary(result: SubmissionResult) -> str:
    lines = [f"# Feedback: {escape(result.lab)} for {escape(result.student)}",
             f"**Score: {result.score:g} / {result.max_score:g}**", ""]
    lines += [f"- `{t.grade_id}`: {t.score:g} / {t.points:g}" + (f" — {escape(t.message.splitlines()[0])}" if t.message else "")
              for t in result.tests]
    if result.message:
        lines += ["", f"**Grading stopped early:** {escape(result.message)}"]
    if result.cell_errors:
        lines += ["", "Errors while running your cells:"] + [f"- {escape(e)}" for e in result.cell_errors[:20]]
    if result.notes:
        lines += ["", "Notebook structure:"] + [f"- {escape(n)}" for n in result.notes]
    return "\n".join(lines)


@functools.lru_cache(maxsize=1)
def _exporter():
    from nbconvert import HTMLExporter
    return HTMLExporter(template_name="lab", sanitize_html=True)  # student markdown may hold scripts


def write_feedback_html(spec: LabSpec, result: SubmissionResult, student_notebook: Path, dest: Path) -> None:
    try:
        student_nb = nbformat.read(student_notebook, as_version=4)
    except Exception:
        student_nb = None
    html, _ = _exporter().from_notebook_node(feedback_notebook(spec, result, student_nb))
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(html)
