"""What a student sees of an exception (autograder.tracebacks): the error, then their cell and
line, the course's frames folded, an unfinished exercise named."""
import time
import traceback
from pathlib import Path

import nbformat
import pytest

from autograder import tracebacks
from autograder.catalog import Catalog, repo_root
from autograder.tracebacks import Cell, cell_label, describe, notebook_cells, where

ROOT = repo_root()
CHECKS = str(Path(tracebacks.__file__).with_name("checks.py"))
DIST = str(ROOT / "camplib" / "dist" / "launch.py")
TORCH = "/env/lib/python3.11/site-packages/torch/nn/functional.py"
CELLS = {"<ipython-input-3-abc>": Cell("cell 9", "exercise 1 — softmax", "test_softmax"),
         "/tmp/ipykernel_1/123.py": Cell("cell 8", "exercise 1 — softmax")}


def frame(filename, lineno, name, line=""):
    return traceback.FrameSummary(filename, lineno, name, line=line, lookup_line=False)


def test_where_starts_at_the_students_cell_and_folds_the_course():
    frames = [frame("/env/lib/python3.11/site-packages/IPython/core/interactiveshell.py", 3500, "run_code", "exec(code)"),
              frame("<ipython-input-3-abc>", 4, "<module>", "check_close('softmax', softmax(x), ref)"),
              frame("/tmp/ipykernel_1/123.py", 7, "softmax", "return torch.softmax(x, dim)"),
              frame(TORCH, 2140, "softmax", "ret = input.softmax(dim)"),
              frame(CHECKS, 120, "check_close", "raise AssertionError(msg)"),
              frame(DIST, 10, "launch", "run()")]
    lines = where(frames, CELLS.get)
    assert lines[0] == "  cell 9, line 4 (test test_softmax)\n      check_close('softmax', softmax(x), ref)"
    assert lines[1].startswith("  cell 8, line 7, in softmax\n      return torch.softmax")
    assert lines[2].startswith("  torch/nn/functional.py, line 2140, in softmax")
    assert lines[3] == "  … 2 frames in the course's code (autograder, camplib.dist)"
    assert len(lines) == 4
    text = "\n".join(lines)
    assert "ipython-input" not in text and "ipykernel" not in text and "interactiveshell" not in text


def test_library_plumbing_between_two_student_frames_is_folded():
    """nn.Module.__call__ between the test's `mha(x)` and the student's `forward`: one line; a
    library frame where the error happened (after the student's last frame) stays."""
    module = "/env/lib/python3.11/site-packages/torch/nn/modules/module.py"
    frames = [frame("<ipython-input-3-abc>", 30, "<module>", "y = mha(x)"),
              frame(module, 1778, "_wrapped_call_impl"), frame(module, 1789, "_call_impl"),
              frame("/tmp/ipykernel_1/123.py", 19, "forward", "return F.linear(x, w)"),
              frame(TORCH, 50, "linear", "return torch._C._nn.linear(x, w)")]
    lines = where(frames, CELLS.get)
    assert lines[1] == "  … 2 frames in torch", lines
    assert lines[2].startswith("  cell 8, line 19, in forward") and lines[3].startswith("  torch/nn/functional.py")
    assert len(lines) == 4


def test_only_course_frames_say_nothing_and_deep_recursion_is_cut():
    assert where([frame(CHECKS, 1, "check_close")], CELLS.get) == []
    deep = [frame("/tmp/ipykernel_1/123.py", 7, "softmax", "return softmax(x)")] * 50
    lines = where(deep, CELLS.get)
    assert len(lines) == tracebacks.MAX_FRAMES and "more frames" in lines[tracebacks.MAX_FRAMES // 2]


def _raise_in(cell_file: str, source: str):
    code = compile(source, cell_file, "exec")
    try:
        exec(code, {})
    except Exception as exc:   # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def test_an_empty_not_implemented_error_names_its_exercise():
    exc = _raise_in("/tmp/ipykernel_1/123.py", "def softmax(x):\n    raise NotImplementedError()\nsoftmax(1)\n")
    text = describe(exc, CELLS.get)
    assert text.splitlines()[0] == "NotImplementedError: exercise 1 — softmax is not written yet"
    assert "cell 8, line 2, in softmax" in text
    worded = _raise_in("/tmp/ipykernel_1/123.py", "raise NotImplementedError('fp16 is not supported')\n")
    assert describe(worded, CELLS.get).splitlines()[0] == "NotImplementedError: fp16 is not supported"
    other = _raise_in("/tmp/ipykernel_1/123.py", "raise ValueError('bad shape')\n")
    assert describe(other, CELLS.get).splitlines()[0] == "ValueError: bad shape"


def test_notebook_cells_know_exercises_and_tests_of_a_released_lab():
    nb = nbformat.read(Catalog.load().get("b01").release_path(ROOT), as_version=4)
    cells = notebook_cells(nb.cells)
    index = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "masks")
    assert cells[index] == Cell(cell_label(index), "exercise 2 — causal and padding masks", "")
    assert cell_label(index) == f"cell {index + 1}"       # 1-based, as a student counts
    test = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "test_masks")
    assert cells[test].test == "test_masks"


def test_a_hostile_heading_costs_no_time():
    """Student markdown reaches the exercise regex in grading: a huge heading must not backtrack."""
    cells = [{"cell_type": "markdown", "source": "# Exercise" + " " * 200_000 + "x"},
             {"cell_type": "markdown", "source": 12},
             {"cell_type": "code", "source": "x = 1", "metadata": "not a dict"}]
    start = time.perf_counter()
    assert [c.exercise for c in notebook_cells(cells)] == ["", "", ""]
    assert time.perf_counter() - start < 1.0   # seconds; quadratic backtracking took minutes


def test_install_makes_an_ipython_shell_point_at_the_cell(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    assert tracebacks.install(shell)
    try:
        shell.run_cell("def f(x):\n    return x + 'a'\n", store_history=True)
        result = shell.run_cell("f(1)", store_history=True)
        assert isinstance(result.error_in_exec, TypeError)
        out = capsys.readouterr().out
        assert out.splitlines()[0] == "TypeError: unsupported operand type(s) for +: 'int' and 'str'"
        assert "cell In [" in out and "line 2, in f" in out
        assert "ipython-input" not in out and "Traceback (most recent call last)" not in out
        import sys
        assert sys.last_value is result.error_in_exec                      # %debug finds it
    finally:
        shell.set_custom_exc((), None)


def test_install_is_a_no_op_outside_a_kernel():
    assert tracebacks.install() is False   # pytest is no Jupyter kernel


@pytest.mark.parametrize("text", ["\x1b[0;31mValueError\x1b[0m: x", "ValueError: x"])
def test_strip_ansi(text):
    assert tracebacks.strip_ansi(text) == "ValueError: x"


@pytest.mark.slow
def test_nbgraders_validate_leads_with_the_error_and_the_students_line(tmp_path):
    """Validate (the lab's Nbgrader > Validate button) shows, for each failed cell, its source and
    then the kernel's traceback: the course makes that traceback short, starting with the error,
    then the student's cell and line (installed by the setup cell's `import autograder.checks`)."""
    from nbgrader.validator import Validator
    from traitlets.config import Config

    from autograder.course.reference import student_notebook

    broken = ("def softmax(x, dim=-1):\n"
              "    e = (x - x.amax(dim=dim, keepdim=True)).exp()\n"
              "    return e / e.sum(dim=dimension, keepdim=True)\n")   # line 3: NameError
    nb = student_notebook("b01", {"softmax": broken})
    cell = 1 + next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    path = tmp_path / "b01_attention.ipynb"
    nbformat.write(nb, path)
    config = Config()
    config.Execute.timeout = 300
    failed = Validator(config=config).validate(str(path))["failed"]
    errors = [f["raw_error"] for f in failed]
    assert len(errors) == 3, errors          # softmax, and sdpa and mha built on it
    for error in errors:
        assert error.splitlines()[0] == "NameError: name 'dimension' is not defined", error
        assert f"cell {cell}, line 3, in softmax" in error and "Traceback (most recent" not in error
        assert "ipykernel_" not in error and "ipython-input" not in error and "\x1b[" not in error
        assert len(error.splitlines()) <= 2 * tracebacks.MAX_FRAMES + 1
