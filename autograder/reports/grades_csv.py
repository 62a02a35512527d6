"""grades.csv, the grade sheet: one row per (student, lab), safe to open in a spreadsheet.

Every text cell goes through `text.csv_cell` (`text.write_inert_csv`) (control characters made visible, formula-looking
cells quoted as OWASP recommends), and the file is replaced atomically so a reader never sees
half a sheet.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, fields
from pathlib import Path

from ..text import write_inert_csv


@dataclass
class GradeRow:
    student: str
    lab: str
    score: float
    max_score: float
    status: str          # graded | error (the student's upload or notebook) | grader error | not submitted
    message: str = ""    # why it lost points (reports.reasons.lost_points), or why it was not graded
    feedback: str = ""   # the student's feedback page, relative to the grading workspace

    @property
    def grader_failed(self) -> bool:
        """The grader, not the student, failed on this submission: `camp grade` exits non-zero."""
        return self.status == GRADER_ERROR


GRADER_ERROR = "grader error"
COLUMNS = [f.name for f in fields(GradeRow)]


def write_grades_csv(rows: list[GradeRow], path: Path) -> None:
    write_inert_csv(path, COLUMNS, (astuple(row) for row in rows))
