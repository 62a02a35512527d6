"""Typical mistakes in lab a08: each must lose exactly its exercise's points, with a message
that helps (graded by tests/course/test_labs.py). Each is the reference solution with one edit."""
from autograder.course.reference import solution_cells
from tests.course.mistakes import Mistake


def _edit(grade_id: str, old: str, new: str):
    def make() -> str:
        source = solution_cells("a08")[grade_id]
        if old not in source:
            raise AssertionError(f"a08 mistake: {old!r} is no longer in the solution of {grade_id}")
        return source.replace(old, new)
    return make


MISTAKES = [
    # |.| of every element before summing: a score that no sign cancellation can lower
    Mistake("unit_importance", _edit("unit_importance", "per_sequence = (act * grad).reshape(",
                                     "per_sequence = (act * grad).abs().reshape("),
            2, "THEN take |.|"),
    # key/value rows picked like query rows, ignoring grouped-query attention's groups
    Mistake("prune_heads", _edit("prune_heads", "kv_rows = [g * D + d for g in groups for d in range(D)]",
                                 "kv_rows = q_rows"),
            3, "kept query rows, then key rows, then value rows"),
    # the soft term without T^2: its gradient shrinks like 1/T^2
    Mistake("distillation_loss", _edit("distillation_loss", "alpha * temperature ** 2 * kl", "alpha * kl"),
            3, "times T^2"),
    # KL averaged over positions AND the vocabulary: V times too small
    Mistake("distillation_loss", _edit("distillation_loss", 'reduction="batchmean"', 'reduction="mean"'),
            3, "not 'mean'"),
]
