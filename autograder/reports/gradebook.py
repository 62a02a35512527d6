"""Scores into nbgrader's sqlite gradebook, through its own API, so nbgrader's tools
(formgrader, manual grading, exports) see the same grades as grades.csv."""
from __future__ import annotations

import datetime
from pathlib import Path

from ..course.nbgrader_setup import COURSE_ID
from ..grading.results import SubmissionResult


def _open(db_path: Path):
    """The gradebook under the course id the instructor's Formgrader uses (nbgrader adds a
    missing course row on open: done here, so Formgrader never needs to write just to list)."""
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{db_path}", COURSE_ID)


def record(db_path: Path, lab_name: str, notebook_id: str, result: SubmissionResult) -> None:
    """Replace any earlier submission of (student, lab) by this result's scores. Each graded
    test gets its auto score and is not flagged "needs manual grade" (nbgrader's default for a
    new grade); only a result the grader could not finish (`retry`) stays flagged. A student new
    to the gradebook gets names Formgrader can show (`_name_from_id`); names already there (set
    in Formgrader's Manage Students) are kept."""
    import warnings

    from nbgrader.api import MissingEntry
    from sqlalchemy.exc import SAWarning

    with warnings.catch_warnings(), _open(db_path) as gb:
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's own session-autoflush chatter
        student = gb.update_or_create_student(result.student)
        if student.first_name is None and student.last_name is None:
            student.first_name, student.last_name = _name_from_id(result.student)
        try:
            gb.remove_submission(lab_name, result.student)
        except MissingEntry:
            pass
        gb.add_submission(lab_name, result.student)
        for test in result.tests:
            grade = gb.find_grade(test.grade_id, notebook_id, lab_name, result.student)
            grade.auto_score = test.score
            grade.needs_manual_grade = bool(result.retry)
        gb.db.commit()


def _name_from_id(student_id: str) -> tuple[str, str]:
    """(first name, last name) for a student known only by id: the id as the last name, the
    first name empty. Formgrader shows a missing name as "None, None"; the id is all `camp
    grade` knows (nbgrader's Manage Students, or `nbgrader db student import`, sets real ones)."""
    return "", student_id


def set_submission_time(db_path: Path, lab_name: str, student: str, when: datetime.datetime | None) -> None:
    """Record when the submission was turned in. Formgrader counts a submission as autograded
    only when this equals its submitted/<student>/<lab>/timestamp.txt (None when there is none)."""
    with _open(db_path) as gb:
        gb.find_submission(lab_name, student).timestamp = when
        gb.db.commit()


def scores(db_path: Path, lab_name: str, student: str) -> tuple[float, float]:
    """(score, max_score) of a submission as the gradebook has it."""
    with _open(db_path) as gb:
        sub = gb.find_submission(lab_name, student)
        return float(sub.score), float(sub.max_score)


def needs_manual_grade(db_path: Path, lab_name: str, student: str) -> bool:
    """Whether Formgrader flags the submission for manual grading."""
    with _open(db_path) as gb:
        return bool(gb.find_submission(lab_name, student).needs_manual_grade)
