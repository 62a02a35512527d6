"""`camp run`: papermill injects the profile's parameters, and a failing notebook is reported with
the cell that failed. (Every lab's own ci run: tests/course/test_labs.py.)"""
import nbformat
import pytest

from autograder.catalog import Lab, repo_root
from autograder.course.execute import parse_value, run_lab

ROOT = repo_root()


def _toy_lab(tmp_path, *sources, tag_first=True):
    lab = Lab(id="x01", name="x01_toy", level="basic", title="toy", status="ready",
              profiles={"ci": {"n": 1}, "gpu": {"n": 2}}, cell_timeout=30)
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    for src in sources:
        nb.cells.append(nbformat.v4.new_code_cell(src))
    if tag_first:
        nb.cells[0].metadata["tags"] = ["parameters"]
    path = lab.source_path(tmp_path)
    path.parent.mkdir(parents=True)
    nbformat.write(nb, path)
    return lab


@pytest.mark.slow
def test_failure_names_the_cell_and_parameters_are_injected(tmp_path):
    lab = _toy_lab(tmp_path, "n = 0", "import math", "assert n == 5, f'n is {n}'")
    ok = run_lab(lab, tmp_path, tmp_path / "out", "ci", {"n": 5})
    assert ok.ok, ok.message
    bad = run_lab(lab, tmp_path, tmp_path / "out", "gpu")
    assert not bad.ok
    assert "`assert n == 5" in bad.message and "AssertionError: n is 2" in bad.message


@pytest.mark.slow
def test_stderr_in_a_graded_test_cell_fails_the_run(tmp_path):
    lab = _toy_lab(tmp_path, "n = 0", "import sys; print('noise', file=sys.stderr)")
    nb = nbformat.read(lab.source_path(tmp_path), as_version=4)
    nb.cells[1].metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True,
                                        "points": 1, "grade_id": "test_noisy", "schema_version": 3}
    nbformat.write(nb, lab.source_path(tmp_path))
    result = run_lab(lab, tmp_path, tmp_path / "out", "ci")
    assert not result.ok and "test_noisy" in result.message


@pytest.mark.slow
def test_the_labs_cell_limit_applies_to_the_ci_profile_and_an_explicit_one_to_any(tmp_path):
    """The gpu profile trains for minutes in a cell (p02 on SmolLM2): it is not held to the lab's
    grading limit unless `camp run --cell-timeout` asks."""
    import dataclasses

    lab = dataclasses.replace(_toy_lab(tmp_path, "n = 0", "import time; time.sleep(3)"), cell_timeout=1)
    ci = run_lab(lab, tmp_path, tmp_path / "out", "ci")
    assert not ci.ok and "timed out" in ci.message, ci.message
    assert run_lab(lab, tmp_path, tmp_path / "out", "gpu").ok
    explicit = run_lab(lab, tmp_path, tmp_path / "out", "gpu", cell_timeout=1)
    assert not explicit.ok and "timed out" in explicit.message, explicit.message


def test_parameter_values_parse_like_json():
    assert parse_value("3") == 3 and parse_value("0.5") == 0.5 and parse_value("true") is True
    assert parse_value("cuda") == "cuda" and parse_value('"7"') == "7"
