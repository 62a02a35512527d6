"""grades.csv is safe to open in a spreadsheet: formulas quoted (OWASP), controls visible."""
import csv

from autograder.reports.grades_csv import COLUMNS, GradeRow, write_grades_csv


def test_cells_a_spreadsheet_would_run_are_quoted(tmp_path):
    evil = ["=HYPERLINK(\"http://x\")", "+1+1", "-2+3", "@SUM(A1)", "\tcmd", "\r=1", "  =1", "ok \x1b[2J\u202e"]
    rows = [GradeRow(s, "b01", 0.0, 12.0, "error", s) for s in evil]
    write_grades_csv(rows, tmp_path / "grades.csv")
    with open(tmp_path / "grades.csv", newline="", encoding="utf-8") as f:
        read = list(csv.reader(f))
    assert read[0] == COLUMNS and len(read) == len(evil) + 1
    for original, row in zip(evil, read[1:]):
        for cell in (row[0], row[5]):
            assert cell[:1] not in ("=", "+", "-", "@", "\t", "\r") and cell.lstrip()[:1] not in ("=", "+", "-", "@")
        assert row[2:4] == ["0.0", "12.0"]
    assert read[-1][0] == "ok \\x1b[2J\\u202e"
    assert read[1][0] == "'=HYPERLINK(\"http://x\")"
    assert not list(tmp_path.glob("*.tmp"))
