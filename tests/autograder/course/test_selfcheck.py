"""`camp check`: a student's self-check reports visible test cells and structure problems."""
import copy

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.cli import main
from autograder.course.reference import student_notebook
from autograder.course.selfcheck import (
    check_notebook,
    grading_problems,
    structure_problems,
)

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


FORBIDDEN_SDPA = ("import torch.nn.functional as F\n"
                  "def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False):\n"
                  "    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)\n")


def test_self_check_applies_the_graders_own_static_scan_and_repairs(tmp_path):
    lab = Catalog.load().get("b01")
    notes, banned = grading_problems(student_notebook("b01"), lab, ROOT, tmp_path)
    assert (notes, banned) == ([], {})                             # the reference: nothing to say
    notes, banned = grading_problems(student_notebook("b01", {"sdpa": FORBIDDEN_SDPA}), lab, ROOT, tmp_path)
    assert sorted(banned) == ["test_mha", "test_sdpa"] and "forbids" in banned["test_sdpa"]
    (tmp_path / "helpers.py").write_text("import torch\nf = torch.ops.aten._softmax\n")   # files next to it too
    _, banned = grading_problems(student_notebook("b01"), lab, ROOT, tmp_path)
    assert sorted(banned) == ["test_masks", "test_mha", "test_sdpa", "test_softmax"]
    nb = student_notebook("b01")
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "test_masks"]
    notes, _ = grading_problems(nb, lab, ROOT, tmp_path / "none")
    assert any("test_masks" in n for n in notes)


@pytest.mark.slow
def test_self_check_fails_the_tests_grading_would_zero(tmp_path, capsys):
    path = tmp_path / "b01_attention.ipynb"
    nbformat.write(student_notebook("b01", {"sdpa": FORBIDDEN_SDPA}), path)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  test_sdpa (4 pts)" in out and "FAIL  test_mha (4 pts)" in out and "PASS  test_softmax" in out
    assert "test_sdpa will score 0 when graded" in out and "not checked here" in out and "4/12 points" in out


BROKEN_SOFTMAX = ("def softmax(x, dim=-1):\n"
                  "    shifted = x - x.amax(dim=dim, keepdim=True)\n"
                  "    e = shifted.exp()\n"
                  "    return e / e.sum(dim=dimension, keepdim=True)\n")   # line 4: NameError


@pytest.mark.slow
def test_self_check_points_at_the_students_cell_and_line_and_is_quiet(tmp_path, capfd):
    """A copy of b01 with a broken softmax and the other exercises unfinished: the traceback says
    "cell N, line 4, in softmax" (N: the softmax cell's place in the notebook), unfinished exercises
    are named, and neither the kernel's TCP warning nor IPython's long traceback reaches the student."""
    nb = student_notebook("b01", {"softmax": BROKEN_SOFTMAX}, solve=False)
    path = tmp_path / "b01_attention.ipynb"
    nbformat.write(nb, path)
    cell = 1 + next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "softmax")
    assert main(["check", str(path)]) == 1
    out, err = capfd.readouterr()
    assert "FAIL  test_softmax (2 pts)  NameError: name 'dimension' is not defined" in out, out
    assert f"cell {cell}, line 4, in softmax" in out, out
    assert "return e / e.sum(dim=dimension, keepdim=True)" in out
    assert "NotImplementedError: exercise 2 — causal and padding masks is not written yet" in out, out
    for noise in ("TCP", "KeyboardInterrupt", "ipython-input", "ipykernel_", "Traceback (most recent", "\x1b["):
        assert noise not in out + err, (noise, out, err)


def test_a_dead_kernel_names_the_cell_that_stopped_it_without_the_kernels_tcp_warning():
    from autograder.course.selfcheck import stopped_reason

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("install()", execution_count=1),      # camp check's preamble
                nbformat.v4.new_markdown_cell("# title"),
                nbformat.v4.new_code_cell("import torch", execution_count=2),   # notebook cell 2
                nbformat.v4.new_code_cell("import os; os._exit(3)"),            # cell 3: never replied
                nbformat.v4.new_code_cell("x = 1")]
    log = ("[IPKernelApp] WARNING | Kernel is running over TCP without encryption. All communication ...\n"
           "Fatal Python error: Segmentation fault\n")
    reason = stopped_reason(nb, RuntimeError("Kernel died"), log)
    assert reason.splitlines() == ["not run: the notebook's kernel died while running cell 3 (RuntimeError)",
                                   "  Fatal Python error: Segmentation fault"]
