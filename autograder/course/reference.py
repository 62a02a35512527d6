"""Reference submissions made from the course's own files: the released notebook filled with the
solution (or with chosen answers). Tests, CI and the grading benchmark grade these."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

from ..catalog import Catalog, repo_root

ROOT = repo_root()
_MARKER_LINE = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n?", re.M)


def solution_cells(lab_key: str) -> dict[str, str]:
    """grade_id -> source of each solution cell of the lab, markers removed (what a student
    who solved everything would have written)."""
    lab = Catalog.load().get(lab_key)
    nb = nbformat.read(lab.source_path(ROOT), as_version=4)
    return {c.metadata["nbgrader"]["grade_id"]: _MARKER_LINE.sub("", c.source)
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")}


def student_notebook(lab_key: str, answers: dict[str, str] | None = None, solve: bool = True):
    """The released notebook with solution cells filled: by the reference solution when
    `solve`, then by `answers` (grade_id -> code) for the cells given."""
    lab = Catalog.load().get(lab_key)
    nb = nbformat.read(lab.release_path(ROOT), as_version=4)
    filled = {**(solution_cells(lab_key) if solve else {}), **(answers or {})}
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in filled:
            cell.source = filled[grade_id]
    return nb


def write_submission(submissions: Path, student: str, lab_key: str, nb) -> Path:
    lab = Catalog.load().get(lab_key)
    path = submissions / student / lab.name / lab.notebook
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path
