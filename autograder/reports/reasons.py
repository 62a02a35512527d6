"""Why a submission lost its points, in one line: the grade sheet's message, which `camp grade`'s
table, grades.csv and report.html all show (each makes it inert its own way: `text.inert`,
`text.csv_cell`, `text.html_text`), so the instructor reads the same reason the student's
feedback gives, without opening it.

The reason is the grader's own words, never re-guessed from them: the whole submission's reason
when there is one (a rejected upload, an invalid notebook, a forbidden API found before
anything ran, a grader failure), else the cells that could not run (a crash, a timeout: what
the tests after them then miss), then each distinct test message with the tests that got it
("test_a, test_b: your code called torch.nn.functional.softmax, which this lab forbids").
"""
from __future__ import annotations

import re

from ..grading.results import SubmissionResult

MAX_REASON = 500        # characters in grades.csv and report.html (the terminal table cuts sooner)
MAX_CELL_ERRORS = 2     # cells named before "(+N more)"
# the seed note the engine adds to a hidden test's message: `camp grade` prints the run's seed once
_SEED_NOTE = re.compile(r"\s*\[this run's hidden cases used seed \d+\]\s*$")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return _SEED_NOTE.sub("", lines[0]) if lines else ""


def lost_points(result: SubmissionResult) -> str:
    """One line saying why `result` scored less than its maximum ("" when nothing was lost)."""
    if result.message:
        return _first_line(result.message)[:MAX_REASON]
    lost = [t for t in result.tests if t.score < t.points]
    if not lost:
        return ""
    parts = []
    errors = [_first_line(e) for e in result.cell_errors if _first_line(e)]
    if errors:
        more = len(errors) - MAX_CELL_ERRORS
        parts.append("; ".join(errors[:MAX_CELL_ERRORS]) + (f" (+{more} more cells)" if more > 0 else ""))
    by_reason: dict[str, list[str]] = {}
    for test in lost:
        by_reason.setdefault(_first_line(test.message) or "no points", []).append(test.grade_id)
    parts += [f"{', '.join(ids)}: {reason}" for reason, ids in by_reason.items()]
    return "; ".join(parts)[:MAX_REASON]
