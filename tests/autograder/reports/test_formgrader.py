"""Formgrader sees what `camp grade` publishes, through nbgrader's own API configured exactly as
the repository's nbgrader_config.py configures it (instructor_config), and the exchange works
(release -> submit -> collect). The grader itself is not run here (tests/browser and
tests/autograder/grading do): results are made from the lab's own test list."""
import datetime
import os
import shutil
import stat

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.labspec import LabSpec
from autograder.course.nbgrader_setup import (
    COURSE_ID,
    SUBMITTED,
    instructor_config,
    nbgrader_api,
    nbgrader_config,
    prepare_instructor_folders,
    submission_folder,
)
from autograder.course.reference import student_notebook, write_submission
from autograder.grading.results import SubmissionResult
from autograder.grading.results import TestOutcome as Outcome
from autograder.grading.uploads import copy_plain_files
from autograder.grading.uploads.turned_in import record_turned_in
from autograder.reports.formgrader import (
    MISSING_SOLUTION,
    autograded_notebook,
    publish_for_formgrader,
)
from autograder.reports.gradebook import needs_manual_grade, record

ROOT = repo_root()
LAB = Catalog.load().get("b01")


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """A grading workspace and exchange the instructor config points at (as $CAMP_* would)."""
    monkeypatch.setenv("CAMP_GRADING_DIR", str(tmp_path / "grading"))
    monkeypatch.setenv("CAMP_EXCHANGE_DIR", str(tmp_path / "exchange"))
    ws, exchange = prepare_instructor_folders(ROOT)
    copy_plain_files(LAB.source_path(ROOT).parent, ws / "source" / LAB.name)   # as camp grade does
    assert nbgrader_api(nbgrader_config(ws)).generate_assignment(LAB.name, force=True, create=True)["success"]
    return ws, exchange


def _publish(ws, student, nb, lost=(), uploads=None):
    """What camp grade does for a graded submission (its copy in collected/ with the time it was
    turned in, then gradebook and Formgrader): `lost` tests score 0. `uploads`: the submissions
    folder the notebook came from (its file times), default the workspace's own collected/."""
    spec = LabSpec.from_notebook(ws / "source" / LAB.name / LAB.notebook)
    if nb is not None:
        write_submission(ws / SUBMITTED, student, LAB.id, nb)
    record_turned_in(submission_folder(ws, student, LAB.name), uploads or ws / SUBMITTED, student, (LAB.name,))
    tests = [Outcome(t.grade_id, t.points, 0.0 if t.grade_id in lost else t.points,
                         "wrong" if t.grade_id in lost else "") for t in spec.tests]
    result = SubmissionResult(student, LAB.id, "graded", sum(t.score for t in tests), spec.max_score, tests)
    record(ws / "gradebook.db", LAB.name, LAB.notebook.removesuffix(".ipynb"), result)
    return publish_for_formgrader(ws, LAB, result), spec


def _instructor_api():
    return nbgrader_api(instructor_config(ROOT))


def test_config_reads_the_workspace_camp_grade_writes(workspace):
    ws, exchange = workspace
    c = instructor_config(ROOT)
    assert c.CourseDirectory.db_url == f"sqlite:///{ws / 'gradebook.db'}"
    assert c.CourseDirectory.course_id == COURSE_ID and c.Exchange.root == str(exchange)
    assert (c.CourseDirectory.source_directory, c.CourseDirectory.release_directory) == ("solutions", "labs")


def test_default_workspace_is_grading_in_the_repository(monkeypatch):
    from autograder.cli import make_parser
    from autograder.course.nbgrader_setup import grading_workspace

    monkeypatch.delenv("CAMP_GRADING_DIR", raising=False)
    assert grading_workspace(ROOT) == ROOT / "grading"
    assert make_parser().parse_args(["grade", "x"]).out is None   # camp grade then uses grading_workspace
    monkeypatch.setenv("CAMP_GRADING_DIR", "grading/fall-2026")    # relative: to the repository
    assert grading_workspace(ROOT) == ROOT / "grading" / "fall-2026"
    assert instructor_config(ROOT).CourseDirectory.autograded_directory == "grading/fall-2026/autograded"


def test_formgrader_lists_graded_submissions_with_scores_and_no_manual_flags(workspace):
    ws, _ = workspace
    _publish(ws, "ada", student_notebook("b01"))
    _, spec = _publish(ws, "carl", student_notebook("b01"), lost={"test_softmax"})
    subs = {s["student"]: s for s in _instructor_api().get_submissions(LAB.name)}
    assert set(subs) == {"ada", "carl"}, subs
    for student, expected in (("ada", spec.max_score), ("carl", spec.max_score - _points(spec, "test_softmax"))):
        s = subs[student]
        assert (s["autograded"], s["needs_manual_grade"], s["score"]) == (True, False, expected), (student, s)
        assert not needs_manual_grade(ws / "gradebook.db", LAB.name, student)
    assert LAB.name in {a["name"] for a in _instructor_api().get_assignments()}


def _points(spec, grade_id):
    return next(t.points for t in spec.tests if t.grade_id == grade_id)


def test_autograded_notebook_is_the_students_with_the_courses_graded_cells(workspace):
    ws, _ = workspace
    source = nbformat.read(ws / "source" / LAB.name / LAB.notebook, as_version=4)
    spec = LabSpec.from_notebook(ws / "source" / LAB.name / LAB.notebook)
    nb = student_notebook("b01")
    test_cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == spec.tests[0].grade_id)
    test_cell.source = "assert True  # edited by the student"
    nb.cells.append(nbformat.v4.new_code_cell("print('mine')", outputs=[nbformat.v4.new_output(
        "display_data", data={"text/html": "<script>alert(1)</script>"})]))
    nb.cells.append(nbformat.from_dict(dict(test_cell)))                    # a duplicated graded cell
    solution = spec.solution_ids[0]
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != solution]  # deleted
    result = SubmissionResult("x", LAB.id, "graded", 0, spec.max_score,
                              [Outcome(t.grade_id, t.points, 0.0, "boom") for t in spec.tests])
    out = autograded_notebook(source, nb, result)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in out.cells]
    graded_ids = [i for i in ids if i]
    assert sorted(graded_ids) == sorted(c.metadata["nbgrader"]["grade_id"] for c in source.cells
                                        if c.metadata.get("nbgrader", {}).get("grade_id")), ids
    first_test = out.cells[ids.index(spec.tests[0].grade_id)]
    assert first_test.source == spec.tests[0].source and "BEGIN HIDDEN TESTS" in first_test.source
    assert "boom" in first_test.outputs[0].text
    assert out.cells[ids.index(solution)].source == MISSING_SOLUTION
    assert not any(o.get("output_type") == "display_data" for c in out.cells if c.cell_type == "code" for o in c.outputs)
    assert any(c.source == "print('mine')" for c in out.cells)


def test_exchange_release_submit_collect_then_graded(workspace, tmp_path):
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.exchange.default.submit import ExchangeSubmit

    ws, exchange = workspace
    inbound = exchange / COURSE_ID / "inbound"
    assert stat.S_IMODE(os.stat(inbound).st_mode) == 0o2733, oct(os.stat(inbound).st_mode)
    api = _instructor_api()
    assert api.release_assignment(LAB.name)["success"]
    assert (exchange / COURSE_ID / "outbound" / LAB.name / LAB.notebook).is_file()
    home = tmp_path / "student-home"
    write_submission(home.parent / "tmp-subs", "me", "b01", student_notebook("b01"))
    shutil.copytree(home.parent / "tmp-subs" / "me" / LAB.name, home / LAB.name)
    c = instructor_config(ROOT)
    c.Exchange.assignment_dir = str(home)
    coursedir = CourseDirectory(config=c)
    coursedir.assignment_id = LAB.name
    ExchangeSubmit(coursedir=coursedir, authenticator=Authenticator(config=c), config=c).start()
    assert api.collect(LAB.name)["success"]
    student = next((ws / "collected").iterdir()).name
    assert (ws / "collected" / student / LAB.name / "timestamp.txt").is_file()
    listed = {s["student"]: s for s in _instructor_api().get_submissions(LAB.name)}
    assert listed[student]["autograded"] is False          # collected, not graded yet
    _publish(ws, student, None)                             # camp grade of what was collected
    listed = {s["student"]: s for s in _instructor_api().get_submissions(LAB.name)}
    assert listed[student]["autograded"] is True and listed[student]["timestamp"], listed[student]


def test_an_unreadable_timestamp_is_replaced_by_the_uploads_time(workspace):
    ws, _ = workspace
    nb = write_submission(ws / SUBMITTED, "eve", "b01", student_notebook("b01"))
    os.utime(nb, (1_700_000_000, 1_700_000_000))
    (nb.parent / "timestamp.txt").write_text("not a time \x1b[2J" + "9" * 500)
    _publish(ws, "eve", None)
    listed = {s["student"]: s for s in _instructor_api().get_submissions(LAB.name)}
    assert listed["eve"]["autograded"] is True
    assert listed["eve"]["timestamp"] == datetime.datetime(2023, 11, 14, 22, 13, 20).isoformat(), listed["eve"]


def test_formgrader_counts_dates_and_names_what_camp_grade_graded(workspace, tmp_path):
    """The same numbers as `camp grade`: one submission per graded student, each with the time it
    was turned in (nbgrader's timestamp.txt, else the upload's file time) and a name that is
    not "None, None"; a name set in Formgrader survives a regrade."""
    ws, _ = workspace
    uploads = tmp_path / "uploads"
    ada = write_submission(uploads, "ada", "b01", student_notebook("b01"))
    os.utime(ada, (1_750_000_000, 1_750_000_000))                    # a zip or folder from elsewhere
    bob = write_submission(uploads, "bob", "b01", student_notebook("b01"))
    (bob.parent / "timestamp.txt").write_text("2026-01-02 03:04:05.000006 UTC")   # nbgrader submit's
    for student in ("ada", "bob"):
        copy_plain_files(uploads / student / LAB.name, submission_folder(ws, student, LAB.name))
        _publish(ws, student, None, uploads=uploads)
    api = _instructor_api()
    assert api.get_assignment(LAB.name)["num_submissions"] == 2
    subs = {s["student"]: s for s in api.get_submissions(LAB.name)}
    assert subs["ada"]["timestamp"] == datetime.datetime.fromtimestamp(
        1_750_000_000, datetime.timezone.utc).replace(tzinfo=None).isoformat()
    assert subs["bob"]["timestamp"] == "2026-01-02T03:04:05.000006"
    for student in ("ada", "bob"):
        s = subs[student]
        assert s["autograded"] and s["display_timestamp"] and (s["first_name"], s["last_name"]) == ("", student), s
    students = {s["id"]: s for s in api.get_students()}
    assert None not in (students["ada"]["first_name"], students["ada"]["last_name"])
    from nbgrader.api import Gradebook
    with Gradebook(instructor_config(ROOT).CourseDirectory.db_url, COURSE_ID) as gb:
        gb.update_or_create_student("ada", first_name="Ada", last_name="Lovelace")
    _publish(ws, "ada", None, uploads=uploads)
    assert {s["student"]: (s["first_name"], s["last_name"]) for s in api.get_submissions(LAB.name)}["ada"] == \
        ("Ada", "Lovelace")
