"""Typical mistakes in lab a04: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
from autograder.course.reference import solution_cells
from tests.course.mistakes import Mistake


def _edit(grade_id: str, old: str, new: str):
    def source() -> str:
        code = solution_cells("a04")[grade_id]
        assert old in code, f"a04 {grade_id}: the reference solution no longer contains {old!r}"
        return code.replace(old, new)
    return source


MISTAKES = [
    # 1F1B warm-up off by one: p - r forwards before the steady state (rank 0 then holds p + 1 in flight)
    Mistake("schedule_1f1b", _edit("schedule_1f1b", "warmup = min(p - r - 1, m)", "warmup = min(p - r, m)"), 3,
            "warm-up forwards"),
    # the micro-batch losses summed, not averaged: loss and every gradient m times too large
    Mistake("pipeline_train_step", _edit("pipeline_train_step", "out = stage(x, targets) / m", "out = stage(x, targets)"),
            4, "divided by m"),
]
