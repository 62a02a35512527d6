"""Student-controlled cell metadata (nbgrader's fields, tags) is type-checked in one place, when
the notebook is read (autograder.grading.uploads.notebooks.repair_metadata): a malformed field is
ignored and said in the student's feedback notes, never a grader error, a crash while publishing
to Formgrader, or a submission retried on every run."""
import contextlib
import csv
import io
import json

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.cli import main
from autograder.course.labspec import LabSpec
from autograder.course.reference import student_notebook, write_submission
from autograder.grading.program import build_program
from autograder.grading.uploads.notebooks import parse_notebook

ROOT = repo_root()
LAB = Catalog.load().get("b01")
SPEC = LabSpec.from_notebook(LAB.source_path(ROOT))


def _cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _malformed() -> nbformat.NotebookNode:
    """b01's reference answers; the softmax cell's nbgrader metadata a string, the masks cell's
    grade_id a list and points a string, a markdown cell's nbgrader a list."""
    nb = student_notebook("b01")
    softmax, masks = _cell(nb, "softmax"), _cell(nb, "masks").metadata["nbgrader"]
    softmax.metadata["nbgrader"] = "solution"
    masks["grade_id"], masks["points"] = ["masks"], "2"
    next(c for c in nb.cells if c.cell_type == "markdown").metadata["nbgrader"] = ["x"]
    return nb


def test_malformed_metadata_is_repaired_and_said():
    repairs = []
    nb = parse_notebook(json.dumps(_malformed()), "b01_attention.ipynb", repairs)
    assert all(isinstance(c.metadata.get("nbgrader", {}), dict) for c in nb.cells)
    assert all(isinstance(c.metadata.get("nbgrader", {}).get("grade_id", ""), str) for c in nb.cells)
    assert any("nbgrader metadata was a str, not a mapping" in r for r in repairs), repairs
    assert any("grade_id, points of the wrong type" in r for r in repairs), repairs
    assert any("was a list" in r for r in repairs), repairs
    program = build_program(SPEC, nb)     # the cells without their metadata still run, as added cells
    assert any("solution cell 'softmax' is missing" in n for n in program.notes), program.notes
    assert parse_notebook(json.dumps(student_notebook("b01")), "b01.ipynb", clean := []) and clean == []


@pytest.mark.slow
def test_a_submission_with_malformed_metadata_is_graded_published_and_not_retried(tmp_path):
    subs, out = tmp_path / "submissions", tmp_path / "ws"
    write_submission(subs, "mallory", "b01", _malformed())
    args = ["grade", str(subs), "--out", str(out), "--isolation", "none", "--seed", "7"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        row = next(r for r in csv.DictReader(f) if r["student"] == "mallory")
    assert row["status"] == "graded", row
    result = json.loads((out / "results" / LAB.name / "mallory.json").read_text())["result"]   # saved: not retried
    assert result["retry"] is False and any("not a mapping" in n for n in result["notes"]), result["notes"]
    assert float(row["score"]) == 12, "the answers are the reference's: repaired metadata costs nothing"
    assert (out / "autograded" / "mallory" / LAB.name / LAB.notebook).is_file()      # Formgrader's copy
    before = (out / "results" / LAB.name / "mallory.json").stat().st_mtime_ns
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    assert (out / "results" / LAB.name / "mallory.json").stat().st_mtime_ns == before, "graded again"
