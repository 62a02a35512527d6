"""`camp build`: labs/ is generated from solutions/ deterministically and leaks nothing."""
import filecmp

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.cli import main
from autograder.course.release import check_release, leaks, release_labs

ROOT = repo_root()


@pytest.mark.slow
def test_committed_labs_are_up_to_date_and_leak_nothing(capsys):
    assert main(["build", "--check"]) == 0, capsys.readouterr().out


@pytest.mark.slow
def test_build_is_deterministic(tmp_path):
    labs = Catalog.load().ready()
    release_labs(labs, ROOT, tmp_path / "one")
    release_labs(labs, ROOT, tmp_path / "two")
    for lab in labs:
        cmp = filecmp.dircmp(tmp_path / "one" / lab.name, tmp_path / "two" / lab.name)
        assert not (cmp.diff_files or cmp.left_only or cmp.right_only), f"{lab.id}: two builds differ"


def test_released_notebooks_have_no_solutions_or_hidden_tests():
    for lab in Catalog.load().ready():
        released = nbformat.read(lab.release_path(ROOT), as_version=4)
        text = "\n".join(c.source for c in released.cells)
        assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
        graded = [c for c in released.cells if c.metadata.get("nbgrader", {}).get("solution")]
        assert graded and all("raise NotImplementedError" in c.source for c in graded)


def _nb(*sources):
    nb = nbformat.v4.new_notebook()
    for i, src in enumerate(sources):
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["nbgrader"] = {"grade_id": f"c{i}", "solution": "SOLUTION" in src,
                                     "grade": "HIDDEN" in src, "locked": False, "schema_version": 3}
        nb.cells.append(cell)
    return nb


def test_leak_detector_finds_solution_code_and_hidden_tests(tmp_path):
    source = _nb("def f():\n    ### BEGIN SOLUTION\n    return 42 * secret()\n    ### END SOLUTION\n",
                 "check()\n### BEGIN HIDDEN TESTS\nassert f() == 42\n### END HIDDEN TESTS\n")
    nbformat.write(source, tmp_path / "src.ipynb")
    clean = _nb("def f():\n    # YOUR CODE HERE\n    raise NotImplementedError()\n", "check()\n")
    nbformat.write(clean, tmp_path / "clean.ipynb")
    leaky = _nb("def f():\n    return 42 * secret()\n", "check()\nassert f() == 42\n")
    nbformat.write(leaky, tmp_path / "leaky.ipynb")
    assert leaks(tmp_path / "src.ipynb", tmp_path / "clean.ipynb") == []
    assert leaks(tmp_path / "src.ipynb", tmp_path / "leaky.ipynb") == [
        "solution of cell 'c0' present", "hidden test of cell 'c1' present"]


@pytest.mark.slow
def test_check_reports_a_stale_release(tmp_path, monkeypatch):
    import shutil
    lab = Catalog.load().ready()[0]
    root = tmp_path / "course"
    shutil.copytree(ROOT / "solutions" / lab.name, root / "solutions" / lab.name)
    shutil.copytree(ROOT / "labs" / lab.name, root / "labs" / lab.name)
    released = root / "labs" / lab.name / lab.notebook
    nb = nbformat.read(released, as_version=4)
    nb.cells[0].source += "\nedited by hand"
    nbformat.write(nb, released)
    problems = [str(p) for p in check_release([lab], root)]
    assert problems == [f"{lab.id}: labs/{lab.name}/{lab.notebook} is stale: run `camp build {lab.id}`"]
