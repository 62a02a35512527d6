"""engine: the seed note only where a hidden (random) case failed; cells are labelled 1-based."""
import nbformat

from autograder.catalog import Catalog, repo_root
from autograder.course import labspec
from autograder.course.labspec import LabSpec
from autograder.grading.engine import failed_in_hidden
from autograder.grading.program import build_program

ROOT = repo_root()
SOURCE = """def compare(x):
    assert x < 3, f"case {x}"
compare(1)
### BEGIN HIDDEN TESTS
for case in range(5):
    compare(case)
### END HIDDEN TESTS
compare(0)
"""
TEST = labspec.TestCell("test_x", 1.0, SOURCE, "")


def _raised(source: str):
    try:
        exec(compile(source, "<test_x>", "exec"), {})
    except AssertionError as exc:
        return exc
    raise AssertionError("did not raise")


def test_a_failing_hidden_case_is_told_and_a_visible_one_is_not():
    assert failed_in_hidden(_raised(SOURCE), TEST)             # case 3, inside the hidden block
    visible = SOURCE.replace("compare(1)", "compare(7)")       # line 3: a visible case
    assert not failed_in_hidden(_raised(visible), labspec.TestCell("test_x", 1.0, visible, ""))
    after = SOURCE.replace("range(5)", "range(2)").replace("compare(0)", "compare(9)")   # after the block
    assert not failed_in_hidden(_raised(after), labspec.TestCell("test_x", 1.0, after, ""))


def test_an_error_outside_the_test_cell_is_not_a_hidden_failure():
    try:
        exec(compile("raise AssertionError('x')", "<other>", "exec"), {})
    except AssertionError as exc:
        assert not failed_in_hidden(exc, TEST)


def test_program_labels_count_cells_from_one():
    lab = Catalog.load().get("b01")
    nb = nbformat.read(lab.release_path(ROOT), as_version=4)
    program = build_program(LabSpec.from_notebook(lab.source_path(ROOT)), nb)
    index = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    assert f"cell {index + 1} (softmax)" in [c.label for c in program.cells]
