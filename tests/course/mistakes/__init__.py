"""Typical mistakes per lab, one module per lab id (b02.py, a01.py, ...): each is a submission that
is the reference solution except for one exercise, written the way students get it wrong. The lab
round trip (tests/course/test_labs.py) grades them next to the reference and a blank notebook:
each must lose exactly `points_lost` with a message containing `hint`.

`source` is the mistaken cell's code, or a function of no arguments that makes it (usually an
edit of the reference solution: `solution_edit`)."""
from __future__ import annotations

import importlib
from typing import Callable, NamedTuple

from autograder.course.reference import solution_cells


class Mistake(NamedTuple):
    grade_id: str                      # the solution cell the mistake replaces
    source: str | Callable[[], str]
    points_lost: float
    hint: str                          # text the failing test's message must contain

    def code(self) -> str:
        return self.source() if callable(self.source) else self.source


def solution_edit(lab_id: str, grade_id: str, old: str, new: str) -> Callable[[], str]:
    """A mistake's source: the reference solution of `grade_id` with `old` replaced by `new`, made
    when the round trip asks; fails loudly when the solution no longer contains `old`. Each lab
    module binds its id: `_edit = functools.partial(solution_edit, "a04")`."""
    def source() -> str:
        code = solution_cells(lab_id)[grade_id]
        if old not in code:
            raise AssertionError(f"{lab_id} mistake: {old!r} is no longer in the reference solution of {grade_id}")
        return code.replace(old, new)
    return source


def mistakes_of(lab_id: str) -> list[Mistake]:
    """The lab's mistakes ([] when the lab has no module here yet)."""
    try:
        module = importlib.import_module(f"{__name__}.{lab_id}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{lab_id}":
            raise
        return []
    return list(module.MISTAKES)
