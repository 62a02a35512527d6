"""Scores into nbgrader's sqlite gradebook, through its own API, so nbgrader's tools
(formgrader, manual grading, exports) see the same grades as grades.csv."""
from __future__ import annotations

from pathlib import Path

from ..grading.results import SubmissionResult


def record(db_path: Path, lab_name: str, notebook_id: str, result: SubmissionResult) -> None:
    """Replace any earlier submission of (student, lab) by this result's scores."""
    import warnings

    from nbgrader.api import Gradebook, MissingEntry
    from sqlalchemy.exc import SAWarning

    with warnings.catch_warnings(), Gradebook(f"sqlite:///{db_path}") as gb:
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's own session-autoflush chatter
        gb.update_or_create_student(result.student)
        try:
            gb.remove_submission(lab_name, result.student)
        except MissingEntry:
            pass
        gb.add_submission(lab_name, result.student)
        for test in result.tests:
            grade = gb.find_grade(test.grade_id, notebook_id, lab_name, result.student)
            grade.auto_score = test.score
        gb.db.commit()


def scores(db_path: Path, lab_name: str, student: str) -> tuple[float, float]:
    """(score, max_score) of a submission as the gradebook has it."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db_path}") as gb:
        sub = gb.find_submission(lab_name, student)
        return float(sub.score), float(sub.max_score)
