"""Typical mistakes in lab a04: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py)."""
import functools

from tests.course.mistakes import Mistake, solution_edit


_edit = functools.partial(solution_edit, "a04")


MISTAKES = [
    # 1F1B warm-up off by one: p - r forwards before the steady state (rank 0 then holds p + 1 in flight)
    Mistake("schedule_1f1b", _edit("schedule_1f1b", "warmup = min(p - r - 1, m)", "warmup = min(p - r, m)"), 3,
            "warm-up forwards"),
    # the micro-batch losses summed, not averaged: loss and every gradient m times too large
    Mistake("pipeline_train_step", _edit("pipeline_train_step", "out = stage(x, targets) / m", "out = stage(x, targets)"),
            4, "divided by m"),
]
