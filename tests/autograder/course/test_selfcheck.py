"""`camp check`: a student's self-check reports visible test cells and structure problems."""
import copy

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.cli import main
from autograder.course.reference import student_notebook
from autograder.course.selfcheck import check_notebook, structure_problems

ROOT = repo_root()


@pytest.mark.slow
def test_self_check_passes_a_solved_notebook_and_flags_a_wrong_one(tmp_path, capsys):
    good = tmp_path / "good" / "b01_attention.ipynb"
    good.parent.mkdir()
    nbformat.write(student_notebook("b01"), good)
    assert main(["check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "PASS  test_softmax (2 pts)" in out and "12/12 points" in out

    bad = tmp_path / "bad" / "b01_attention.ipynb"
    bad.parent.mkdir()
    nbformat.write(student_notebook("b01", solve=False), bad)
    assert main(["check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  test_softmax (2 pts)  NotImplementedError" in out and "0/12 points" in out


def test_structure_problems_name_missing_and_duplicated_cells():
    released = nbformat.read(Catalog.load().get("b01").release_path(ROOT), as_version=4)
    nb = copy.deepcopy(released)
    test_cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_masks"]
    nb.cells.remove(test_cells[0])
    dup = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    nb.cells.append(copy.deepcopy(dup))
    assert structure_problems(nb, released) == ["graded cell 'test_masks' is missing",
                                                "graded cell 'softmax' appears 2 times"]
    assert structure_problems(released, released) == []


def test_invalid_notebook_is_reported(tmp_path, capsys):
    path = tmp_path / "b01_attention.ipynb"
    path.write_text("{not json")
    problems, results = check_notebook(path, Catalog.load(), ROOT)
    assert results == [] and problems[0].startswith("not a valid notebook")
