"""report.html: counts, a per-student table with scores per exercise and feedback links,
integer axes, offline and escaped."""
import re

from autograder.grading.results import SubmissionResult
from autograder.grading.results import TestOutcome as Outcome
from autograder.reports.class_report import lab_figure, write_report
from autograder.reports.grades_csv import GradeRow

EVIL = "<script>x</script>\u202e\x1b[2J"


def _class():
    results, rows = [], []
    for i, (name, a, b) in enumerate([("ada", 2, 4), ("bob", 0, 4), ("cy", 1, 0), ("dee", 2, 2)]):
        r = SubmissionResult(name, "b01", "graded", score=a + b, max_score=6,
                             tests=[Outcome("test_a", 2, a, "" if a == 2 else EVIL), Outcome("test_b", 4, b)])
        results.append(r)
        rows.append(GradeRow(name, "b01", r.score, 6, "graded", "", f"feedback/{name}/b01_attention/b01_attention.html"))
    rows += [GradeRow("eve", "b01", 0, 6, "error", "zip entry " + EVIL, "feedback/eve/b01_attention/x.html"),
             GradeRow("fay", "b01", 0, 6, "not submitted"),
             GradeRow("gus", "b01", 0, 6, "grader error", "boom"),
             GradeRow("'\\x1b]0;id", "", 0, 0, "error", "not a valid student id")]
    return rows, results


def test_report_counts_links_and_escapes(tmp_path):
    rows, results = _class()
    write_report(rows, results, tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "6 submitted, 4 graded, 1 errors, 1 grader errors, 1 not submitted" in html
    assert html.count("data:image/png;base64,") == 1
    assert "<a href='feedback/ada/b01_attention/b01_attention.html'>feedback</a>" in html
    assert re.search(r"<td>cy</td><td>graded</td><td class='num'>1 / 6</td><td class='num'>1</td>"
                     r"<td class='num'>0</td>", html), "score per exercise"
    assert "<tr><td>test_a</td><td>50%</td>" in html
    assert "<script" not in html and "\u202e" not in html and "\x1b" not in html
    assert "&lt;script&gt;" in html and "\\u202e" in html
    assert not re.search(r"""(src|href)\s*=\s*['"]?(https?:)?//""", html)
    assert "Uploads that could not be read" in html


def test_histogram_axes_are_integers():
    _, results = _class()
    fig = lab_figure("b01", results, ["test_a", "test_b"])
    for ax, axes in zip(fig.axes, (("x", "y"), ("x",))):
        for which in axes:
            ticks = getattr(ax, f"get_{which}ticks")()
            assert all(float(t).is_integer() for t in ticks), (which, list(ticks))
    import matplotlib.pyplot as plt
    plt.close(fig)
