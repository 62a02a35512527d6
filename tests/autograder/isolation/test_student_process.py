"""The student's process (isolation/student_process.Runner) reports where their code raised as
"cell N, line M" (autograder.tracebacks), with the cell labels the grader sent, never IPython's
`<ipython-input-…>` names; an empty NotImplementedError names the unfinished exercise."""
import pytest

from autograder.isolation.student_process import Runner


@pytest.fixture(scope="module")
def runner():
    r = Runner([])
    r.handle({"op": "exec", "source": "def softmax(x, dim=-1):\n    '''doc'''\n    raise NotImplementedError()\n",
              "cell": "cell 8", "exercise": "exercise 1 — a numerically stable softmax"}, {})
    r.handle({"op": "exec", "source": "def helper(x):\n    return x + 'a'\n\ndef masks(n):\n    return helper(n)\n",
              "cell": "cell 12", "exercise": "exercise 2 — causal and padding masks"}, {})
    return r


def _call(runner, name, *args):
    header, _ = runner.handle({"op": "call", "target": name, "args": list(args), "kwargs": {"__dict__": {}}}, {})
    return header


def test_an_error_points_at_the_cell_and_line(runner):
    header = _call(runner, "masks", 3)
    assert header["error"] == "TypeError: unsupported operand type(s) for +: 'int' and 'str'"
    assert header["traceback"].splitlines() == ["  cell 12, line 5, in masks", "      return helper(n)",
                                                "  cell 12, line 2, in helper", "      return x + 'a'"]


def test_the_unfinished_template_names_its_exercise(runner):
    header = _call(runner, "softmax", 1)
    assert header["error"] == "NotImplementedError: exercise 1 — a numerically stable softmax is not written yet"
    assert header["error_type"] == "NotImplementedError"
    assert header["traceback"].startswith("  cell 8, line 3, in softmax")


def test_a_cell_that_raises_says_where(runner):
    header, _ = runner.handle({"op": "exec", "source": "x = 1\nmasks(x)\n", "cell": "cell 14"}, {})
    value = header["value"]
    assert value.splitlines()[0].startswith("TypeError: unsupported operand")
    assert "cell 14, line 2" in value and "cell 12, line 2, in helper" in value
    assert "ipython-input" not in value and "Traceback" not in value


def test_the_graders_own_frames_never_show(runner):
    header = _call(runner, "softmax")   # wrong arguments: nothing of the student's ran
    assert header["error"].startswith("TypeError") and header["traceback"] == ""
