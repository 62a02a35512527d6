"""A student's feedback page in a real browser, opened from disk as students do: formulas are
typeset by the local MathJax copy (no raw `\\(...\\)` left, nothing requested off the machine) and
a score such as "12 / 12" stays on one line."""
import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.labspec import LabSpec
from autograder.course.reference import student_notebook
from autograder.grading.results import SubmissionResult
from autograder.grading.results import TestOutcome as Outcome
from autograder.reports.feedback import write_feedback_html

from .conftest import typeset_formulas


@pytest.mark.slow
def test_feedback_typesets_formulas_offline_and_scores_do_not_wrap(browser_page, tmp_path):
    spec = LabSpec.from_notebook(Catalog.load().get("b01").source_path(repo_root()))
    tests = [Outcome(t.grade_id, t.points, t.points, "") for t in spec.tests]
    result = SubmissionResult("ada", "b01", "graded", score=12, max_score=12, tests=tests)
    nb = tmp_path / "b01_attention.ipynb"
    student = student_notebook("b01")
    student.cells.insert(1, nbformat.v4.new_markdown_cell(   # a student's TeX trying links, styles, loads
        r"$\href{javascript:alert(1)}{x}$ and $\style{background:url(https://evil.example/x.png)}{y}$"
        r" and $\class{camp-page}{z}$"))
    nbformat.write(student, nb)
    root = tmp_path / "feedback"
    page_path = root / "ada" / "b01_attention" / "b01_attention.html"
    write_feedback_html(spec, result, nb, page_path, feedback_root=root)

    requests, violations = [], []
    browser_page.on("request", lambda r: requests.append(r.url))
    browser_page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    browser_page.set_viewport_size({"width": 480, "height": 900})      # narrow: where "12 / 12" wrapped
    browser_page.goto(page_path.as_uri())
    seen = typeset_formulas(browser_page)
    assert seen["formulas"] > 5 and seen["typeset"] == seen["formulas"] and not seen["raw"], seen
    assert browser_page.evaluate("document.querySelectorAll('[href^=\"javascript\"]').length") == 0
    assert all(u.startswith("file://") or u == "about:blank" for u in requests), \
        [u for u in requests if not u.startswith("file://")]
    # MathJax's MathML output declares its TeX web fonts, which the policy refuses (none is needed):
    # nothing else
    assert all(v.startswith("Loading the font ") for v in violations), violations
    heights = browser_page.evaluate("[...document.querySelectorAll('td.points')].map("
                                    "td => [td.innerText, td.getClientRects()[0].height])")
    line = browser_page.evaluate("parseFloat(getComputedStyle(document.querySelector('td.points')).lineHeight)"
                                 " || 20")
    assert heights and all(h < 2 * line for _, h in heights), heights
