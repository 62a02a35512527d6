"""Feedback pages: rendered HTML (not tags shown as text), offline, points and a PASS/FAIL table
at the top, every student byte inert, hidden test source never shown."""
import re

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.labspec import LabSpec
from autograder.course.reference import student_notebook
from autograder.grading.results import SubmissionResult
from autograder.grading.results import TestOutcome as Outcome
from autograder.reports.feedback import feedback_page, write_feedback_html

HOSTILE_MD = """# My \u202eanswer
<script>alert('x')</script><img src="http://evil.example/p.png" onerror="alert(1)">
<iframe src="https://evil.example"></iframe><link rel=stylesheet href="https://cdn.example/x.css">

![tracker](https://evil.example/track.png) [click](javascript:alert(1)) [docs](https://pytorch.org)
<style>@import url(https://evil.example/x.css);</style> text \x1b[31m red
"""
RESOURCE_LOAD = re.compile(r"""(<script|<iframe|<link|<object|<embed|<img(?![^>]*src='data:)|"""
                           r"""(src|href)\s*=\s*["']?\s*(https?:|javascript:|//)(?![^>]*rel='noreferrer))""", re.I)


@pytest.fixture(scope="module")
def spec():
    return LabSpec.from_notebook(Catalog.load().get("b01").source_path(repo_root()))


def _result(spec, failed=("test_sdpa",)):
    tests = [Outcome(t.grade_id, t.points, 0.0 if t.grade_id in failed else t.points,
                         "wrong output <b>max diff</b> 0.5 \u202e\x1b[2J" if t.grade_id in failed else "")
             for t in spec.tests]
    return SubmissionResult("ada", "b01", "graded", score=sum(t.score for t in tests), max_score=spec.max_score,
                            tests=tests, cell_errors=["NameError: <x> \u2066"], notes=["cell re-typed"])


def _student_nb():
    nb = student_notebook("b01")
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(HOSTILE_MD))
    nb.cells.insert(2, nbformat.v4.new_code_cell("print('</pre><script>alert(1)</script>')\t# \u202e"))
    return nb


def test_page_is_rendered_offline_and_inert(spec):
    page = feedback_page(spec, _result(spec), _student_nb())
    assert "<h1>My \\u202eanswer</h1>" in page, "markdown must be rendered, with the bidi override made visible"
    assert "&lt;script&gt;alert(" in page and "&lt;/pre&gt;&lt;script&gt;" in page
    assert "[image: tracker]" in page and "evil.example/track.png" not in page
    assert "javascript:" not in page and "href='https://pytorch.org'" in page
    loads = [m.group(0) for m in RESOURCE_LOAD.finditer(page)]
    loads += [css for css in re.findall(r"<style>(.*?)</style>", page, re.S) if re.search(r"@import|url\(", css)]
    assert not loads, f"the page would load: {loads}"
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search("[\x00-\x08\x0b-\x1f\u202a-\u202e\u2066-\u2069]", page)
    assert "&lt;h1&gt;" not in page and "&lt;p&gt;" not in page, "our own tags must not show as text"


def test_points_and_a_pass_fail_table_come_first(spec):
    page = feedback_page(spec, _result(spec), _student_nb())
    top = page[:page.index("Your notebook, with the verdicts")]
    assert "Score: 8 / 12 points" in top
    for t in spec.tests:
        verdict = "FAIL" if t.grade_id == "test_sdpa" else "PASS"
        assert re.search(rf"<td>{t.grade_id}</td><td class='points'>[\d.]+ / {t.points:g}</td><td><span class='\w+'>{verdict}", top), \
            t.grade_id
    assert "wrong output &lt;b&gt;max diff&lt;/b&gt; 0.5 \\u202e\\x1b[2J" in top
    assert "NameError: &lt;x&gt; \\u2066" in top


def test_hidden_test_source_never_appears(spec):
    page = feedback_page(spec, _result(spec), _student_nb())
    hidden = [c.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
              for c in nbformat.read(Catalog.load().get("b01").source_path(repo_root()), as_version=4).cells
              if "### BEGIN HIDDEN TESTS" in c.source]
    lines = [l.strip() for block in hidden for l in block.splitlines() if len(l.strip()) > 25]
    visible = "\n".join(t.visible_source for t in spec.tests)
    lines = [l for l in lines if l not in visible]
    assert len(lines) > 10
    import html
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert not [l for l in lines if l in text]
    assert text.count("PASSED") == 3 and text.count("FAILED test_sdpa") == 1


def test_an_unreadable_notebook_still_gets_its_verdicts(spec, tmp_path):
    nb = tmp_path / "b01_attention.ipynb"
    nb.write_bytes(b"[" * 200_000)
    dest = tmp_path / "fb" / "page.html"
    write_feedback_html(spec, _result(spec, failed=[t.grade_id for t in spec.tests]), nb, dest)
    page = dest.read_text(encoding="utf-8")
    assert "could not be read" in page and page.count("FAILED") == len(spec.tests)


def test_tex_is_kept_verbatim_not_eaten_by_markdown():
    from autograder.reports.feedback import render_markdown
    html = render_markdown(r"as $\mathrm{softmax}\big(QK^\top/\sqrt{d}\big)\,V$ and $$x_{i} < y_{j}$$")
    assert r"<span class='camp-math'>\(\mathrm{softmax}\big(QK^\top/\sqrt{d}\big)\,V\)</span>" in html
    assert r"<span class='camp-math display'>\[x_{i} &lt; y_{j}\]</span>" in html


def test_formulas_are_typeset_by_the_local_mathjax_only(spec, tmp_path):
    """With a feedback folder, the page carries one inline loader, allowed by its hash alone (the
    CSP allows 'self' and that hash: no URL with a scheme, no other inline script), which looks for
    MathJax where camp grade installs it (once) and where the course's fetch step does; a Jupyter
    server's own copy is found from the page's URL (tests/browser/test_hub_in_browser.py)."""
    import base64
    import hashlib

    from autograder.reports.feedback import MATHJAX_DIR
    from autograder.reports.mathjax import MARKER
    root = tmp_path / "feedback"
    dest = root / "ada" / "b01_attention" / "b01_attention.html"
    nb = tmp_path / "b01_attention.ipynb"
    nbformat.write(_student_nb(), nb)
    write_feedback_html(spec, _result(spec), nb, dest, feedback_root=root)
    page = dest.read_text(encoding="utf-8")
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page, re.S)
    assert [attrs for attrs, _ in scripts] == [f" {MARKER}"], scripts
    loader = scripts[0][1]
    assert '["../../.mathjax", "../mathjax"]' in loader and "static/jupyter_server_mathjax" in loader, loader
    csp = re.search(r'Content-Security-Policy\' content="([^"]*)"', page).group(1)
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    digest = base64.b64encode(hashlib.sha256(loader.encode()).digest()).decode()
    assert directives["script-src"] == f"'self' 'sha256-{digest}'" and directives["default-src"] == "'none'", directives
    assert "http" not in csp and "*" not in csp and "unsafe" not in directives["script-src"]
    assert (root / MATHJAX_DIR / "MathJax.js").is_file()
    assert "<span class='camp-math'>" in page                                   # b01's markdown has formulas
    stamp = (root / MATHJAX_DIR / "MathJax.js").stat().st_mtime_ns
    write_feedback_html(spec, _result(spec), nb, root / "bob" / "b01_attention" / "b01_attention.html",
                        feedback_root=root)
    assert (root / MATHJAX_DIR / "MathJax.js").stat().st_mtime_ns == stamp   # installed once


def test_without_a_feedback_folder_no_script_at_all(spec):
    page = feedback_page(spec, _result(spec), _student_nb())
    assert "<script" not in page and "script-src" not in page and "<noscript" not in page


def test_scores_do_not_wrap(spec):
    page = feedback_page(spec, _result(spec), _student_nb())
    assert ".points{white-space:nowrap}" in page and "<td class='points'>2 / 2</td>" in page
