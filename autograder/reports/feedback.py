"""Per-student feedback: one self-contained, offline HTML page.

At the top the points and a PASS/FAIL table (one row per graded test, with its message), then
the student's notebook with every graded test cell replaced by its visible part (as released)
followed by the grader's verdict. Hidden test source never appears; hidden test messages do,
because they tell the student what to fix.

Every byte from the submission is inert here: text is escaped, the student's markdown is
rendered with raw HTML escaped, unsafe link schemes dropped and images shown as their alt text
(an image would be a network load), and the page carries a Content-Security-Policy that forbids
any remote resource and every script but a local MathJax copy and the one inline loader that
finds it (reports/mathjax.py: `script-src 'self'` and the loader's hash). Formulas (`$...$`,
`$$...$$`) are typeset by that copy, which the page finds itself where `camp grade` wrote it,
where nbgrader's fetch_feedback put it and where a Jupyter server serves it (the page is never
rewritten: nbgrader compares its bytes); without a copy they stay readable TeX. Nothing comes from
a CDN.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

from ..catalog import GradingCaps
from ..course.labspec import LabSpec
from ..grading.results import SubmissionResult
from ..text import html_text, inert

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
MATHJAX_DIR = ".mathjax"   # in the feedback folder: no student id starts with a dot
_STYLE = """
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}
table{border-collapse:collapse;margin:1rem 0}td,th{border:1px solid #ccc;padding:.25rem .6rem;text-align:left;
vertical-align:top}pre{background:#f6f8fa;padding:.6rem;overflow-x:auto;white-space:pre-wrap;word-break:break-word}
.score{font-size:1.4rem;font-weight:bold}.pass{color:#1a7f37;font-weight:bold}.fail{color:#cf222e;font-weight:bold}
.verdict{border-left:4px solid #cf222e;padding-left:.6rem}.verdict.ok{border-color:#1a7f37}
.stopped{background:#fff4e5;padding:.6rem;border-left:4px solid #d97706}.cell{margin:1rem 0}
.md{border-left:2px solid #eee;padding-left:.8rem}.points{white-space:nowrap}
"""


def _markdown_renderer():
    import mistune

    class SafeRenderer(mistune.HTMLRenderer):
        """Raw HTML escaped (escape=True), unsafe URL schemes replaced by mistune's safe_url,
        images shown as their alt text, links that open no referrer."""

        def image(self, text: str, url: str, title: str | None = None) -> str:
            return f"<span class='image'>[image: {text}]</span>"

        def link(self, text: str, url: str, title: str | None = None) -> str:
            return f"<a href='{self.safe_url(url)}' rel='noreferrer nofollow'>{text}</a>"

    return mistune.create_markdown(renderer=SafeRenderer(escape=True), plugins=["table", "strikethrough"])


@functools.lru_cache(maxsize=1)
def _markdown():
    return _markdown_renderer()


_MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+?\$", re.S)


def render_markdown(source: str) -> str:
    """Student markdown as safe HTML (no raw tags, scripts, remote images or javascript: links).
    TeX ($...$, $$...$$) is kept out of markdown's reach (it would eat the backslashes) and put,
    escaped, in `<span class='camp-math'>` as \\(...\\) or \\[...\\]: what the local MathJax typesets."""
    math: list[str] = []

    def stash(m: re.Match) -> str:
        math.append(m.group(0))
        return f"CAMPMATH{len(math) - 1}X"

    html = _markdown()(_MATH.sub(stash, inert(source, keep="\n\t")))
    return re.sub(r"CAMPMATH(\d+)X", lambda m: _math(math[int(m.group(1))]) if int(m.group(1)) < len(math)
                  else m.group(0), html)


def _math(tex: str) -> str:
    display = tex.startswith("$$")
    body = tex[2:-2] if display else tex[1:-1]
    open_, close = ("\\[", "\\]") if display else ("\\(", "\\)")
    return f"<span class='camp-math{' display' if display else ''}'>{html_text(open_ + body + close, keep=chr(10))}</span>"


def _pre(text: str) -> str:
    return f"<pre>{html_text(text, keep=chr(10) + chr(9))}</pre>"


def _verdict(test, visible_source: str) -> str:
    passed = not test.message
    word = "PASSED" if passed else "FAILED"
    text = (test.output or "") + f"{word} {test.grade_id}: {test.score:g} / {test.points:g} points" + \
        ("" if passed else "\n" + test.message)
    return (f"<div class='cell test'>{_pre(visible_source)}"
            f"<div class='verdict{' ok' if passed else ''}'>{_pre(text)}</div></div>")


def _summary(result: SubmissionResult) -> list[str]:
    parts = [f"<h1>Feedback: {html_text(result.lab)} for {html_text(result.student)}</h1>",
             f"<p class='score'>Score: {result.score:g} / {result.max_score:g} points</p>"]
    if result.message:
        parts.append(f"<p class='stopped'><strong>Grading stopped early:</strong> {html_text(result.message, 2000)}</p>")
    parts.append("<table><tr><th>test</th><th>points</th><th>verdict</th><th>message</th></tr>")
    for t in result.tests:
        verdict = "<span class='pass'>PASS</span>" if not t.message else "<span class='fail'>FAIL</span>"
        parts.append(f"<tr><td>{html_text(t.grade_id)}</td><td class='points'>{t.score:g} / {t.points:g}</td><td>{verdict}</td>"
                     f"<td>{_pre(t.message) if t.message else ''}</td></tr>")
    parts.append("</table>")
    if result.cell_errors:
        parts.append("<h2>Errors while running your cells</h2><ul>" +
                     "".join(f"<li>{_pre(e)}</li>" for e in result.cell_errors[:20]) + "</ul>")
    if result.notes:
        parts.append("<h2>Notebook structure</h2><ul>" +
                     "".join(f"<li>{html_text(n, 2000)}</li>" for n in result.notes[:50]) + "</ul>")
    return parts


def feedback_page(spec: LabSpec, result: SubmissionResult, student_nb, mathjax: list[str] | None = None) -> str:
    """The whole page; `student_nb` is the student's notebook (None if it could not be read);
    `mathjax` the relative folder URLs where a local MathJax copy may be, in order (None: formulas
    stay TeX; reports/mathjax.py)."""
    from .mathjax import NOSCRIPT, loader_script

    by_id = {t.grade_id: t for t in result.tests}
    visible = {t.grade_id: t.visible_source for t in spec.tests}
    loader, allowed = loader_script(mathjax) if mathjax else ("", "")
    csp = f"{CSP}; script-src 'self' {allowed}" if mathjax else CSP
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">",
             f"<title>Feedback: {html_text(result.lab)} for {html_text(result.student)}</title>",
             f"<style>{_STYLE}</style>{loader}</head><body class='camp-page'>{NOSCRIPT if mathjax else ''}"]
    parts += _summary(result)
    parts.append("<h2>Your notebook, with the verdicts</h2>")
    shown: set[str] = set()
    if student_nb is None:
        parts.append("<p>Your notebook could not be read, so only the tests are shown.</p>")
    for cell in (student_nb.cells if student_nb is not None else []):
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in visible:
            if grade_id not in shown and grade_id in by_id:
                shown.add(grade_id)
                parts.append(_verdict(by_id[grade_id], visible[grade_id]))
        elif cell.get("cell_type") == "code":
            parts.append(f"<div class='cell code'>{_pre(cell.get('source', ''))}</div>")
        elif cell.get("cell_type") == "markdown":
            parts.append(f"<div class='cell md'>{render_markdown(cell.get('source', ''))}</div>")
    for grade_id in visible:  # tests the student deleted still get their verdict
        if grade_id not in shown and grade_id in by_id:
            parts.append(_verdict(by_id[grade_id], visible[grade_id]))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_feedback_html(spec: LabSpec, result: SubmissionResult, student_notebook: Path, dest: Path,
                        caps: GradingCaps = GradingCaps(), feedback_root: Path | None = None) -> None:
    """Write the page to `dest`; with `feedback_root` (the folder of every student's feedback),
    MathJax is installed once in its MATHJAX_DIR and the page typesets its formulas with it, or,
    once nbgrader's fetch_feedback copied the page to `<lab>/feedback/<timestamp>/`, with the copy
    the course's fetch step installs beside it (`../FETCHED_DIR`)."""
    import os

    from ..grading.uploads import read_notebook
    from .mathjax import FETCHED_DIR, install_mathjax

    try:
        student_nb = read_notebook(student_notebook, caps)
    except Exception:  # missing, rejected or unreadable: the page says so
        student_nb = None
    dest.parent.mkdir(parents=True, exist_ok=True)
    mathjax = None
    if feedback_root is not None and install_mathjax(Path(feedback_root) / MATHJAX_DIR) is not None:
        mathjax = [Path(os.path.relpath(Path(feedback_root) / MATHJAX_DIR, dest.parent)).as_posix(), f"../{FETCHED_DIR}"]
    dest.write_text(feedback_page(spec, result, student_nb, mathjax), encoding="utf-8")


RELEASE_KEYS = ("timestamp.txt", "submission_secret.txt")   # what nbgrader's release_feedback reads
KEY_BYTES = 4096


def copy_release_keys(submission: Path, feedback_dir: Path) -> None:
    """Put the submission's timestamp.txt and submission_secret.txt (written by nbgrader's submit,
    kept by its collect) beside its feedback page, as nbgrader's generate_feedback would: then
    nbgrader's release_feedback (Formgrader's button, or `nbgrader release_feedback LAB`)
    publishes camp's page under the hash of that secret, which only the student's own copy of the
    submission can name. A key the upload lacks is removed, never left from an older upload.
    The files are the student's: read with a byte bound, never through a link."""
    import os

    for name in RELEASE_KEYS:
        dest = Path(feedback_dir) / name
        try:
            fd = os.open(Path(submission) / name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            dest.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(KEY_BYTES + 1)
        if len(data) > KEY_BYTES:
            dest.unlink(missing_ok=True)
            continue
        dest.write_bytes(data)
