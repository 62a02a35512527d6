"""`camp grade`'s outputs tell the instructor the same story: why each submission lost its points
is in the printed table, grades.csv and report.html (inert in each), and Formgrader counts and
dates exactly the submissions graded (collected/ with each upload's time).

The grader itself is replaced by a pool that returns made-up results (no sandbox: these tests are
about what is published, tests/autograder/grading/test_grade.py grades for real)."""
import csv
import datetime
import os

import pytest

from autograder.cli import main
from autograder.course.nbgrader_setup import SUBMITTED, instructor_config, nbgrader_api
from autograder.course.reference import student_notebook, write_submission
from autograder.grading import grade as grade_module
from autograder.catalog import repo_root
from autograder.grading.results import SubmissionResult
from autograder.grading.results import TestOutcome as Outcome
from autograder.grading.uploads.turned_in import read_stamp
from autograder.reports.reasons import lost_points

LAB, LAB_NAME = "b01", "b01_attention"
FORBIDDEN = "your code called torch.nn.functional.scaled_dot_product_attention, which this lab forbids"
HOSTILE = "<img src=x onerror=alert(1)>\u202e\x1b[2J=cmd"
WHY = {"ada": FORBIDDEN, "bea": "timed out after 120 s", "cy": HOSTILE}
UPLOADED = 1_760_000_000   # the uploads' file time (no timestamp.txt in them)


class MadeUpPool:
    """Stands in for GradingPool: each student loses test_softmax (2 points) for their reason."""

    def __init__(self, n, isolation, threads, warm):
        pass

    def run(self, jobs):
        for job in jobs:
            tests = [Outcome("test_softmax", 2.0, 0.0, WHY[job["student"]]), Outcome("test_masks", 2.0, 2.0)]
            yield job, SubmissionResult(job["student"], job["lab"], "graded", 2.0, 4.0, tests), False

    def close(self):
        pass


@pytest.fixture
def graded(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(grade_module, "GradingPool", MadeUpPool)
    monkeypatch.setenv("CAMP_GRADING_DIR", str(tmp_path / "ws"))   # where Formgrader (instructor_config) looks
    monkeypatch.setenv("CAMP_EXCHANGE_DIR", str(tmp_path / "exchange"))
    subs = tmp_path / "subs"
    for student in WHY:
        nb = write_submission(subs, student, LAB, student_notebook(LAB))
        os.utime(nb, (UPLOADED, UPLOADED))
    (subs / "carl.zip").write_bytes(b"junk")
    os.utime(subs / "carl.zip", (UPLOADED + 60, UPLOADED + 60))
    out = tmp_path / "ws"
    assert main(["grade", str(subs), "--out", str(out), "--isolation", "none", "--lab", LAB]) == 0
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        sheet = {r["student"]: r for r in csv.DictReader(f)}
    return out, sheet, capsys.readouterr().out


def test_the_reason_for_lost_points_is_in_the_table_the_sheet_and_the_report(graded):
    out, sheet, table = graded
    report = (out / "report.html").read_text(encoding="utf-8")
    for student in ("ada", "bea"):
        assert sheet[student]["message"] == f"test_softmax: {WHY[student]}", sheet[student]
        assert f"test_softmax: {WHY[student]}"[:100] in table
        assert f"test_softmax: {WHY[student]}" in report
    assert "not a readable zip" in sheet["carl"]["message"] and "not a readable zip" in table
    assert "not a readable zip" in report


def test_hostile_reasons_stay_inert_everywhere(graded):
    out, sheet, table = graded
    report = (out / "report.html").read_text(encoding="utf-8")
    assert sheet["cy"]["message"] == "test_softmax: <img src=x onerror=alert(1)>\\u202e\\x1b[2J=cmd"
    assert "\u202e" not in table and "\x1b" not in table and "\\u202e\\x1b[2J=cmd" in table
    assert "<img src=x" not in report and "&lt;img src=x onerror=alert(1)&gt;\\u202e\\x1b[2J=cmd" in report


def test_formgrader_counts_and_dates_what_was_graded(graded):
    out, sheet, _ = graded
    uploaded = datetime.datetime.fromtimestamp(UPLOADED, datetime.timezone.utc).replace(tzinfo=None)
    for student in WHY:
        assert read_stamp(out / SUBMITTED / student / LAB_NAME) == uploaded
    # carl's zip was refused: his row and a dated trace in collected/, none of his bytes
    assert sorted(p.name for p in (out / SUBMITTED / "carl" / LAB_NAME).iterdir()) == ["timestamp.txt"]
    assert read_stamp(out / SUBMITTED / "carl" / LAB_NAME) == uploaded + datetime.timedelta(seconds=60)
    api = nbgrader_api(instructor_config(repo_root()))
    assert api.get_assignment(LAB_NAME)["num_submissions"] == 4 == sum(r["lab"] == LAB for r in sheet.values())
    listed = {s["student"]: s for s in api.get_submissions(LAB_NAME)}
    assert set(listed) == {"ada", "bea", "cy", "carl"}
    for student, s in listed.items():
        assert s["autograded"] and s["timestamp"] and s["last_name"] == student, s
        assert s["score"] == float(sheet[student]["score"])


def test_grading_the_collected_folder_keeps_it(graded, capsys):
    """`camp grade <workspace>/collected` (after Formgrader's Collect) grades what is there and
    deletes none of it, a refused upload included; the result is the same."""
    out, sheet, _ = graded
    before = {p.relative_to(out / SUBMITTED) for p in (out / SUBMITTED).rglob("*")}
    assert main(["grade", str(out / SUBMITTED), "--out", str(out), "--isolation", "none", "--lab", LAB]) == 0
    assert {p.relative_to(out / SUBMITTED) for p in (out / SUBMITTED).rglob("*")} == before
    with open(out / "grades.csv", newline="", encoding="utf-8") as f:
        again = {r["student"]: r for r in csv.DictReader(f)}
    assert {s: again[s]["message"] for s in WHY} == {s: sheet[s]["message"] for s in WHY}
    assert again["carl"]["status"] == "error"


def test_the_sheets_message_is_the_results_reason(graded):
    """The row is made by reports.reasons from the saved result, nothing else."""
    import json

    out, sheet, _ = graded
    for student in WHY:
        saved = json.loads((out / "results" / LAB_NAME / f"{student}.json").read_text())["result"]
        from autograder.text import csv_cell
        assert sheet[student]["message"] == csv_cell(lost_points(SubmissionResult.from_dict(saved)))
