"""nbgrader's release_feedback and fetch_feedback, for camp's feedback pages.

Release: nbgrader copies a feedback page into the exchange's feedback folder (0711: nobody lists
it) with the mode of the instructor's file. Under `umask 077` (common on shared machines) that is
0600, owned by the instructor: the student whose hash names the page cannot open it, and Fetch
Feedback fails. After nbgrader's own copy this makes every released page 0644; only someone who
knows a submission's secret can name one.

Fetch: nbgrader copies the page alone into `<lab>/feedback/<timestamp>/`, so the MathJax folder
the page loads by relative URL (reports/mathjax.py) is not beside it and its formulas would show
as TeX. After nbgrader's own copy this installs the course's MathJax once in
`<lab>/feedback/mathjax/` (a name Jupyter serves: it refuses hidden folders such as `.mathjax`)
and points each fetched camp page at it (`../mathjax`).

Selected by nbgrader's config (`ExchangeFactory.release_feedback` / `.fetch_feedback`,
autograder.course.hub.nbgrader_hub_config and nbgrader_setup.instructor_config).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from nbgrader.exchange.default.fetch_feedback import ExchangeFetchFeedback
from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback

from ..reports.mathjax import CONFIG_FILE, install_mathjax, script_tags

FETCHED_MATHJAX = "mathjax"   # in <lab>/feedback/, beside the <timestamp>/ folders
_OUR_SCRIPTS = re.compile(r"<script src='([^'<>]*)/" + re.escape(CONFIG_FILE) + "'></script>")


class ReleaseFeedback(ExchangeReleaseFeedback):
    def copy_files(self):
        super().copy_files()
        for page in Path(self.dest_path).glob("*.html"):
            if page.is_file() and not page.is_symlink() and page.stat().st_uid == os.geteuid():
                os.chmod(page, 0o644)


class FetchFeedback(ExchangeFetchFeedback):
    def copy_files(self):
        super().copy_files()
        place_mathjax(Path(self.dest_path))


def place_mathjax(feedback_dir: Path) -> list[Path]:
    """Install MathJax in `feedback_dir`/FETCHED_MATHJAX and make every camp page in its
    timestamp folders load it from there; the pages changed. Pages that are not camp's (no
    camp MathJax scripts) and links are left as they are; without MathJax installed, nothing
    changes (formulas stay readable TeX)."""
    pages = [p for p in sorted(Path(feedback_dir).glob("*/*.html")) if p.is_file() and not p.is_symlink()]
    ours = [(p, text) for p in pages if _OUR_SCRIPTS.search(text := p.read_text(encoding="utf-8", errors="replace"))]
    if not ours or install_mathjax(Path(feedback_dir) / FETCHED_MATHJAX) is None:
        return []
    for page, text in ours:
        url = _OUR_SCRIPTS.search(text).group(1)
        fixed = text.replace(script_tags(url), script_tags(f"../{FETCHED_MATHJAX}"), 1)
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")
    return [p for p, _ in ours]
