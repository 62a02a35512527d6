"""`camp build`: labs/ is generated from solutions/ deterministically, leaks nothing, and every
released lab carries the "How to work" block generated from course/labs.toml."""
import ast
import filecmp

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.cli import main
from autograder.course.howto import (
    CELL_ID,
    HEADING,
    exercises,
    how_to_work,
    strip_handwritten,
)
from autograder.course.labspec import LabSpec
from autograder.course.release import check_release, leaks, release_labs
from autograder.grading.rank_pool import JOIN

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


# ---- the generated "How to work" block (autograder/course/howto.py)

def test_how_to_work_block_renders_for_every_catalog_lab():
    """Planned labs get the same block (without the exercise table) as soon as they exist."""
    catalog = Catalog.load()
    assert len(catalog.labs) == 18
    for lab in catalog.labs:
        text = how_to_work(lab, catalog, lab.source_path(ROOT))
        assert text.startswith(HEADING), (lab.id, text[:80])
        assert f"about {lab.minutes} minutes" in text, lab.id
        assert f"camp check labs/{lab.name}/{lab.notebook}" in text, lab.id
        assert "except the hidden tests" in text, lab.id
        for required in lab.requires:
            assert f"{required} (" in text, (lab.id, required)
        for entry in lab.forbid:
            assert f"`{entry}`" in text, (lab.id, entry)
        if lab.forbid:
            assert "zeroes that exercise's tests" in text, lab.id


def test_how_to_work_lists_every_exercise_with_its_points():
    catalog = Catalog.load()
    for lab in catalog.ready():
        spec = LabSpec.from_notebook(lab.source_path(ROOT))
        found = exercises(lab.source_path(ROOT))
        assert sum(e.points for e in found) == spec.max_score, (lab.id, found)
        names = {n for e in found for n in e.names}
        assert names >= set(spec.student_names) - {"_"}, (lab.id, set(spec.student_names) - names)
        text = how_to_work(lab, catalog, lab.source_path(ROOT))
        for e in found:
            assert f"| {e.title} |" in text and f"| {e.points:g} |" in text, (lab.id, e)


def test_released_labs_carry_the_generated_block_right_after_the_title():
    catalog = Catalog.load()
    for lab in catalog.ready():
        released = nbformat.read(lab.release_path(ROOT), as_version=4)
        block = released.cells[1]
        assert block.cell_type == "markdown" and block.get("id") == CELL_ID, (lab.id, block.get("id"))
        assert block.source == how_to_work(lab, catalog, lab.source_path(ROOT)).rstrip("\n"), lab.id
        others = [i for i, c in enumerate(released.cells) if i != 1 and "How to work" in c.source]
        assert others == [], f"{lab.id}: hand-written 'How to work' text left in cells {others}"
        source = nbformat.read(lab.source_path(ROOT), as_version=4)
        assert all(c.get("id") != CELL_ID for c in source.cells), f"{lab.id}: the source must not carry the block"


def test_strip_handwritten_drops_time_prerequisites_and_how_to_only():
    title = ("# x01 · A lab\n\nIntro text.\n\n**Learning objectives.**\n\n- one\n- two\n\n"
             "**Time:** about 5 minutes.\n\n**Prerequisites:** none.\n\n**How to work.**\n\n"
             "1. Run the cells.\n2. Run the tests.\n\nA closing remark.\n")
    assert strip_handwritten(title) == ("# x01 · A lab\n\nIntro text.\n\n**Learning objectives.**\n\n- one\n- two\n\n"
                                        "A closing remark.\n")
    assert strip_handwritten("# Just a title") == "# Just a title\n"


@pytest.mark.slow
def test_check_reports_a_release_whose_block_is_stale(tmp_path):
    """Changing a lab's catalog entry (here its time estimate) makes the committed release stale."""
    import dataclasses
    import shutil
    lab = Catalog.load().get("b06")
    root = tmp_path / "course"
    shutil.copytree(ROOT / "solutions" / lab.name, root / "solutions" / lab.name)
    shutil.copytree(ROOT / "labs" / lab.name, root / "labs" / lab.name)
    assert check_release([lab], root) == []
    changed = dataclasses.replace(lab, minutes=lab.minutes + 1)
    problems = [str(p) for p in check_release([changed], root)]
    assert problems == [f"{lab.id}: labs/{lab.name}/{lab.notebook} is stale: run `camp build {lab.id}`"]


# ---- what the released visible tests do where the student's code runs

def _make_targets(source: str) -> list[str]:
    tree = ast.parse(source)
    return [node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("make", "separate_ranks")
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)]


def test_visible_tests_hand_student_code_to_nothing_their_lab_forbids():
    """`make(...)` and `separate_ranks(...)`'s rank functions run in the student's processes during
    grading, where the lab's tripwires watch: a target under a forbidden name would zero the
    student's tests for the course's own call."""
    for lab in Catalog.load().ready():
        released = nbformat.read(lab.release_path(ROOT), as_version=4)
        for cell in released.cells:
            if cell.cell_type != "code" or not cell.metadata.get("nbgrader", {}).get("grade"):
                continue
            for target in _make_targets(cell.source):
                hits = [f for f in lab.forbid if any(t == f or t.startswith(f + ".") for t in (target, JOIN))]
                assert hits == [], f"{lab.id} {cell.metadata['nbgrader']['grade_id']}: make({target!r}) is forbidden by {hits}"


def test_widget_cells_are_skipped_by_the_grader():
    for lab in Catalog.load().ready():
        for cell in nbformat.read(lab.source_path(ROOT), as_version=4).cells:
            if cell.cell_type == "code" and "ipywidgets" in cell.source and "setup" not in cell.metadata.get("tags", []):
                assert "skip-grading" in cell.metadata.get("tags", []), f"{lab.id}: widget cell {cell.get('id')} is graded"


def test_forbidden_list_reads_the_same_whether_or_not_a_package_is_installed():
    """The released block must not depend on this machine: a top-level name is a package even where
    it is not installed (a venv without torchao once made `camp build --check` fail)."""
    from autograder.course.howto import _forbidden_in_words
    assert _forbidden_in_words("no_such_package_for_camp") == "the module `no_such_package_for_camp` (anything in it)"
    assert _forbidden_in_words("torch.nn.MultiheadAttention") == "the class `torch.nn.MultiheadAttention`"
    assert _forbidden_in_words("torch.softmax") == "`torch.softmax`"
