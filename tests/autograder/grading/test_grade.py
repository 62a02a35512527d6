"""`camp grade` round trip on a real lab: the reference scores full marks, a blank notebook 0,
one wrong function partial credit, and broken notebooks are reported while the rest are graded."""
import csv
import json
import zipfile

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.cli import main
from autograder.course.reference import student_notebook, write_submission
from autograder.reports.gradebook import scores
from tests.course.mistakes.b01 import TOP_LEFT_MASKS  # a causal mask aligned top-left

ROOT = repo_root()
LAB = "b01"

# softmax without the max subtraction: fine on small inputs, NaN on large ones and on fully
# masked rows, so attention (built on it) fails too
UNSTABLE_SOFTMAX = '''
def softmax(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)
'''
def _with_broken_setup(nb, first_line):
    """The notebook with its setup (imports) cell starting with `first_line`."""
    setup = next(c for c in nb.cells if c.cell_type == "code" and "import torch" in c.source)
    setup.source = first_line + "\n" + setup.source
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grading")
    subs = tmp / "submissions"
    write_submission(subs, "ada", LAB, student_notebook(LAB))
    write_submission(subs, "blank", LAB, student_notebook(LAB, solve=False))
    write_submission(subs, "carl", LAB, student_notebook(LAB, {"softmax": UNSTABLE_SOFTMAX}))
    write_submission(subs, "gus", LAB, student_notebook(LAB, {"masks": TOP_LEFT_MASKS}))
    write_submission(subs, "dora", LAB, _with_broken_setup(student_notebook(LAB), "import no_such_module_for_camp"))
    write_submission(subs, "eve", LAB, _with_broken_setup(student_notebook(LAB), "def broken(:"))
    bad = write_submission(subs, "fred", LAB, student_notebook(LAB))
    bad.write_text(bad.read_text()[:500])  # truncated JSON
    zed = write_submission(tmp / "zipped", "zed", LAB, student_notebook(LAB))   # one .zip per student
    with zipfile.ZipFile(subs / "zed.zip", "w") as z:
        z.write(zed, f"zed/b01_attention/{zed.name}")
    out = tmp / "ws"
    assert main(["grade", str(subs), "--out", str(out), "--jobs", "2"]) == 0
    with open(out / "grades.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    return out, rows, subs


@pytest.mark.slow
def test_reference_solution_scores_full_marks(graded):
    out, rows, _ = graded
    assert rows["ada"]["status"] == "graded"
    assert float(rows["ada"]["score"]) == float(rows["ada"]["max_score"]) == 12
    result = json.loads((out / "results" / "b01_attention" / "ada.json").read_text())["result"]
    assert 0 < result["cells_seconds"] < result["seconds"], result     # where the time went, recorded
    assert all(t["seconds"] > 0 for t in result["tests"]), result["tests"]


@pytest.mark.slow
def test_gradebook_holds_the_same_scores_as_the_grade_sheet(graded):
    out, rows, _ = graded
    for student in ("ada", "carl", "gus", "blank", "fred"):
        assert scores(out / "gradebook.db", "b01_attention", student) == \
            (float(rows[student]["score"]), float(rows[student]["max_score"]))


@pytest.mark.slow
def test_blank_release_scores_zero(graded):
    _, rows, _ = graded
    assert rows["blank"]["status"] == "graded" and float(rows["blank"]["score"]) == 0


@pytest.mark.slow
def test_one_wrong_function_earns_partial_credit(graded):
    _, rows, _ = graded
    full = float(rows["ada"]["max_score"])
    assert float(rows["gus"]["score"]) == full - 2            # test_masks only
    assert float(rows["carl"]["score"]) == full - 2 - 4       # test_softmax and test_sdpa


@pytest.mark.slow
def test_notebooks_that_cannot_run_score_zero_with_a_reason_and_others_are_graded(graded):
    out, rows, _ = graded
    assert rows["dora"]["status"] == "graded" and float(rows["dora"]["score"]) == 0
    assert "ModuleNotFoundError" in rows["dora"]["message"] and "no_such_module_for_camp" in rows["dora"]["message"]
    assert rows["eve"]["status"] == "graded" and float(rows["eve"]["score"]) == 0
    assert "SyntaxError" in rows["eve"]["message"]
    blank = json.loads((out / "results" / "b01_attention" / "blank.json").read_text())["result"]
    for test in blank["tests"]:   # why each test lost its points, in the grader's words (reports.reasons)
        assert test["grade_id"] in rows["blank"]["message"] and test["message"].splitlines()[0].strip()[:60] in \
            rows["blank"]["message"], (test, rows["blank"]["message"])
    assert rows["fred"]["status"] == "error" and "not a valid notebook" in rows["fred"]["message"]
    assert float(rows["fred"]["score"]) == 0
    assert set(rows) == {"ada", "blank", "carl", "gus", "dora", "eve", "fred", "zed"}
    assert float(rows["zed"]["score"]) == 12


@pytest.mark.slow
def test_feedback_shows_messages_but_not_hidden_test_source(graded):
    out, rows, _ = graded
    html = (out / rows["carl"]["feedback"]).read_text()
    text = _visible_text(html)
    assert "softmax of large inputs [1000, 1001]: 4 non-finite value(s)" in text, \
        "the failing test's message should reach the student"
    source = nbformat.read(Catalog.load().get(LAB).source_path(ROOT), as_version=4)
    hidden = [c.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0].strip()
              for c in source.cells if "### BEGIN HIDDEN TESTS" in c.source]
    released = "\n".join(c.source for c in nbformat.read(Catalog.load().get(LAB).release_path(ROOT), as_version=4).cells)
    distinctive = [l.strip() for block in hidden for l in block.splitlines()
                   if len(l.strip()) > 25 and l.strip() not in released]
    assert len(distinctive) > 10
    for line in distinctive:
        assert line not in text, f"hidden test source leaked into feedback: {line!r}"


def _visible_text(html: str) -> str:
    """The text a browser shows: tags dropped (syntax highlighting splits code into spans)."""
    import html as html_lib
    import re
    return html_lib.unescape(re.sub(r"<[^>]+>", "", html))


@pytest.mark.slow
def test_instructor_report_has_figures_and_failure_rates(graded):
    out, rows, _ = graded
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 1 and "<h2>b01</h2>" in html
    failing = sum(1 for r in rows.values() if r["student"] not in ("ada", "gus", "zed"))  # the others fail softmax
    assert f"<tr><td>test_softmax</td><td>{100 * failing / len(rows):.0f}%</td>" in html


@pytest.mark.slow
def test_rerun_is_idempotent_and_resumes_only_unfinished_work(graded, capsys):
    out, rows, subs = graded
    results = out / "results" / "b01_attention"
    before = {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")}
    assert main(["grade", str(subs), "--out", str(out)]) == 0          # nothing changed: nothing regraded
    assert {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")} == before
    with open(out / "grades.csv") as f:
        assert {r["student"]: r["score"] for r in csv.DictReader(f)} == {k: v["score"] for k, v in rows.items()}
    (results / "ada.json").unlink()                                    # as if the grader died before ada
    write_submission(subs, "gus", LAB, student_notebook(LAB))          # gus resubmits, fixed
    assert main(["grade", str(subs), "--out", str(out)]) == 0
    after = {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")}
    changed = sorted(name for name in after if after[name] != before.get(name))
    assert changed == ["ada.json", "gus.json"]
    with open(out / "grades.csv") as f:
        sheet = {r["student"]: float(r["score"]) for r in csv.DictReader(f)}
    assert sheet["ada"] == 12 and sheet["gus"] == 12 and sheet["carl"] == 6
    assert scores(out / "gradebook.db", "b01_attention", "gus") == (12.0, 12.0)


@pytest.mark.slow
def test_grading_without_a_sandbox_is_explicit(tmp_path, monkeypatch, capsys):
    subs = tmp_path / "subs"
    write_submission(subs, "ada", LAB, student_notebook(LAB))
    import autograder.grading.readiness as readiness
    monkeypatch.setattr(readiness, "namespaces_available", lambda: False)
    assert main(["grade", str(subs), "--out", str(tmp_path / "ws")]) == 2
    assert "--isolation none" in capsys.readouterr().err
    assert main(["grade", str(subs), "--out", str(tmp_path / "ws"), "--isolation", "none"]) == 0
    with open(tmp_path / "ws" / "grades.csv") as f:
        assert [(r["student"], float(r["score"])) for r in csv.DictReader(f)] == [("ada", 12.0)]


@pytest.mark.slow
def test_messages_point_at_the_students_cell_and_say_the_seed_only_for_hidden_cases(graded):
    out, _, _ = graded
    nb = student_notebook(LAB)
    cell = {c.metadata.get("nbgrader", {}).get("grade_id"): i + 1 for i, c in enumerate(nb.cells)}

    def messages(student):
        result = json.loads((out / "results" / "b01_attention" / f"{student}.json").read_text())["result"]
        return {t["grade_id"]: t["message"] for t in result["tests"]}

    blank = messages("blank")
    assert "NotImplementedError: exercise 2 — causal and padding masks is not written yet" in blank["test_masks"]
    assert f"cell {cell['masks']}, line" in blank["test_masks"] and "in causal_mask" in blank["test_masks"]
    assert all("ipython-input" not in m and "seed" not in m for m in blank.values()), blank   # visible cases failed
    carl = messages("carl")      # the unstable softmax fails a visible case of test_softmax
    assert carl["test_softmax"] and "hidden cases used seed" not in carl["test_softmax"], carl
    feedback = (out / "feedback" / "blank" / "b01_attention" / "b01_attention.html").read_text()
    assert "exercise 1 — a numerically stable softmax is not written yet" in feedback
