"""Feedback a student fetches through nbgrader's exchange (`nbgrader fetch_feedback`, the
Assignment List's "Fetch Feedback"): nbgrader copies the page alone into
`<lab>/feedback/<timestamp>/`; the course's fetch step (exchange_feedback.FetchFeedback, selected by
the course's nbgrader config) installs MathJax in `<lab>/feedback/mathjax`, one of the places the
page looks, and leaves the page byte for byte as released, so nbgrader's own listing sees the
feedback as fetched and not updated (what makes the Assignment List offer "view feedback"). The
fetch and the listing below are nbgrader's own, on a real exchange layout; the page in a browser,
served by a student's JupyterLab, is tests/browser/test_hub_in_browser.py."""
from pathlib import Path

import pytest
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from nbgrader.exchange.default.list import ExchangeList
from nbgrader.utils import notebook_hash
from traitlets.config import Config

from autograder.catalog import Catalog, repo_root
from autograder.course.exchange_feedback import FetchFeedback
from autograder.course.hub import nbgrader_hub_config
from autograder.course.labspec import LabSpec
from autograder.course.nbgrader_setup import instructor_config
from autograder.grading.results import SubmissionResult
from autograder.grading.results import TestOutcome as Outcome
from autograder.reports.feedback import write_feedback_html
from autograder.reports.mathjax import FETCHED_DIR, mathjax_source

COURSE, LAB, STAMP = "llm-camp", "b01_attention", "2026-12-04 16:58:50.976868 UTC"


@pytest.fixture
def released(tmp_path):
    """camp's b01 page as `camp grade` writes it, released into an exchange under the hash of the
    submission's secret, and the student's cached copy of that submission."""
    if mathjax_source() is None:
        pytest.skip("jupyter-server-mathjax is not installed")
    spec = LabSpec.from_notebook(Catalog.load().get("b01").source_path(repo_root()))
    result = SubmissionResult("ada", "b01", "graded", score=12, max_score=12,
                              tests=[Outcome(t.grade_id, t.points, t.points, "") for t in spec.tests])
    root = tmp_path / "grading" / "feedback"
    page = root / "ada" / LAB / f"{LAB}.html"
    write_feedback_html(spec, result, tmp_path / "missing.ipynb", page, feedback_root=root)
    secret = "ab" * 32
    exchange = tmp_path / "exchange" / COURSE / "feedback"
    exchange.mkdir(parents=True)
    (exchange / f"{notebook_hash(secret=secret, notebook_id=LAB)}.html").write_bytes(page.read_bytes())
    cached = tmp_path / "cache" / COURSE / f"ada+{LAB}+{STAMP}"
    cached.mkdir(parents=True)
    (cached / f"{LAB}.ipynb").write_text("{}")
    (cached / "submission_secret.txt").write_text(secret)
    return tmp_path, page.read_bytes()


def _config(tmp_path: Path) -> Config:
    c = Config()
    c.CourseDirectory.course_id = COURSE
    c.CourseDirectory.assignment_id = LAB
    c.Exchange.root = str(tmp_path / "exchange")
    c.Exchange.cache = str(tmp_path / "cache")
    c.Exchange.assignment_dir = str(tmp_path / "home")
    c.Exchange.path_includes_course = True
    return c


def _run(kind, c: Config):
    return kind(coursedir=CourseDirectory(config=c), authenticator=Authenticator(config=c), config=c).start()


def test_the_course_config_selects_the_fetch_step():
    for c in (nbgrader_hub_config(), instructor_config(repo_root())):
        assert c.ExchangeFactory.fetch_feedback == "autograder.course.exchange_feedback.FetchFeedback"


def test_a_fetched_page_is_unchanged_and_finds_mathjax_beside_it(released):
    tmp_path, released_bytes = released
    c = _config(tmp_path)
    _run(FetchFeedback, c)
    fetched = tmp_path / "home" / COURSE / LAB / "feedback"
    page = fetched / STAMP / f"{LAB}.html"
    assert page.read_bytes() == released_bytes, "the fetch step changed the page: nbgrader would list it as updated"
    assert (fetched / FETCHED_DIR / "MathJax.js").is_file()
    assert (page.parent / f"../{FETCHED_DIR}/MathJax.js").resolve().is_file()   # where the page's loader looks
    c.ExchangeList.cached = True   # the Assignment List's "submitted" section
    [info] = [s for a in _run(ExchangeList, c) if a["assignment_id"] == LAB for s in a["submissions"]]
    assert info["has_local_feedback"] and not info["feedback_updated"], info
    _run(FetchFeedback, c)   # fetching again (new feedback after a resubmission) keeps one working copy
    assert (fetched / FETCHED_DIR / "MathJax.js").is_file() and page.read_bytes() == released_bytes
    assert sorted(p.name for p in fetched.iterdir()) == sorted([STAMP, FETCHED_DIR])


def test_a_page_that_is_not_camps_gets_no_copy(released):
    tmp_path, _ = released
    for page in (tmp_path / "exchange" / COURSE / "feedback").glob("*.html"):
        page.write_text("<html><body>nbgrader's own feedback</body></html>")
    _run(FetchFeedback, _config(tmp_path))
    assert not (tmp_path / "home" / COURSE / LAB / "feedback" / FETCHED_DIR).exists()
