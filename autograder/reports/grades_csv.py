"""grades.csv, the grade sheet: one row per (student, lab), safe to open in a spreadsheet.

Every text cell goes through `text.csv_cell` (control characters made visible, formula-looking
cells quoted as OWASP recommends), and the file is replaced atomically so a reader never sees
half a sheet.
"""
from __future__ import annotations

import csv
import os
from dataclasses import astuple, dataclass, fields
from pathlib import Path

from ..text import csv_cell


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
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([csv_cell(v) for v in astuple(row)])
    os.replace(tmp, path)
