"""Feedback a student fetches through nbgrader's exchange (`nbgrader fetch_feedback`, the
Assignment List's "Fetch Feedback") typesets its formulas offline: nbgrader copies the page alone
into `<lab>/feedback/<timestamp>/`, and the course's fetch step (exchange_feedback.FetchFeedback,
selected by the course's nbgrader config) puts MathJax where the fetched page's scripts point.
The fetch below is nbgrader's own, on a real exchange layout; the browser check of the fetched
page is tests/browser/test_feedback_in_browser.py."""
import re
from pathlib import Path

import pytest
from nbgrader.auth import Authenticator
from nbgrader.coursedir import CourseDirectory
from nbgrader.utils import notebook_hash
from traitlets.config import Config

from autograder.catalog import Catalog, repo_root
from autograder.course.exchange_feedback import FETCHED_MATHJAX, FetchFeedback
from autograder.course.hub import nbgrader_hub_config
from autograder.course.labspec import LabSpec
from autograder.course.nbgrader_setup import instructor_config
from autograder.grading.results import SubmissionResult
from autograder.grading.results import TestOutcome as Outcome
from autograder.reports.feedback import MATHJAX_DIR, write_feedback_html
from autograder.reports.mathjax import CONFIG_FILE, mathjax_source

COURSE, LAB, STAMP = "llm-camp", "b01_attention", "2026-12-04 16:58:50.976868 UTC"


def _script_targets(page: Path) -> list[Path]:
    srcs = re.findall(r"<script src='([^']+)'>", page.read_text(encoding="utf-8"))
    return [(page.parent / src.split("?")[0]).resolve() for src in srcs]


@pytest.fixture
def released(tmp_path):
    """camp's b01 page, written by `camp grade`'s layout (MathJax in the feedback root's
    .mathjax) and released into an exchange under the hash of the submission's secret."""
    if mathjax_source() is None:
        pytest.skip("jupyter-server-mathjax is not installed")
    spec = LabSpec.from_notebook(Catalog.load().get("b01").source_path(repo_root()))
    result = SubmissionResult("ada", "b01", "graded", score=12, max_score=12,
                              tests=[Outcome(t.grade_id, t.points, t.points, "") for t in spec.tests])
    root = tmp_path / "grading" / "feedback"
    page = root / "ada" / LAB / f"{LAB}.html"
    write_feedback_html(spec, result, tmp_path / "missing.ipynb", page, feedback_root=root)
    assert _script_targets(page) and all(t.is_file() for t in _script_targets(page))   # fine where camp wrote it
    secret = "ab" * 32
    exchange = tmp_path / "exchange"
    (exchange / COURSE / "feedback").mkdir(parents=True)
    (exchange / COURSE / "feedback" / f"{notebook_hash(secret=secret, notebook_id=LAB)}.html").write_bytes(page.read_bytes())
    cached = tmp_path / "cache" / COURSE / f"ada+{LAB}+{STAMP}"
    cached.mkdir(parents=True)
    (cached / f"{LAB}.ipynb").write_text("{}")
    (cached / "submission_secret.txt").write_text(secret)
    return tmp_path


def test_the_course_config_selects_the_fetch_step():
    for c in (nbgrader_hub_config(), instructor_config(repo_root())):
        assert c.ExchangeFactory.fetch_feedback == "autograder.course.exchange_feedback.FetchFeedback"


def test_a_fetched_page_finds_mathjax_beside_it(released):
    c = Config()
    c.CourseDirectory.course_id = COURSE
    c.CourseDirectory.assignment_id = LAB
    c.Exchange.root = str(released / "exchange")
    c.Exchange.cache = str(released / "cache")
    c.Exchange.assignment_dir = str(released / "home")
    c.Exchange.path_includes_course = True
    FetchFeedback(coursedir=CourseDirectory(config=c), authenticator=Authenticator(config=c), config=c).start()
    fetched = released / "home" / COURSE / LAB / "feedback"
    page = fetched / STAMP / f"{LAB}.html"
    targets = _script_targets(page)
    assert [t.name for t in targets] == [CONFIG_FILE, "MathJax.js"], targets
    assert all(t.is_file() and t.parent == fetched / FETCHED_MATHJAX for t in targets), targets
    assert not any(part.startswith(".") for t in targets for part in t.relative_to(released).parts), \
        "Jupyter's file server refuses hidden folders"
    assert MATHJAX_DIR not in page.read_text(encoding="utf-8")
    # fetching again (new feedback after a resubmission) keeps one copy and a working page
    FetchFeedback(coursedir=CourseDirectory(config=c), authenticator=Authenticator(config=c), config=c).start()
    assert all(t.is_file() for t in _script_targets(page))
