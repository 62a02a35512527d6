"""nbgrader's release_feedback and fetch_feedback, for camp's feedback pages.

Release: nbgrader copies a feedback page into the exchange's feedback folder (0711: nobody lists
it) with the mode of the instructor's file. Under `umask 077` (common on shared machines) that is
0600, owned by the instructor: the student whose hash names the page cannot open it, and Fetch
Feedback fails. After nbgrader's own copy this makes every released page 0644; only someone who
knows a submission's secret can name one.

Fetch: nbgrader copies the page alone into `<lab>/feedback/<timestamp>/`. After nbgrader's own
copy this installs the course's MathJax once in `<lab>/feedback/mathjax/`, one of the places a
camp page looks for it (reports/mathjax.py), so its formulas are typeset when the page is opened
from disk (a Jupyter server serves its own copy). The page itself is left byte for byte as
released: nbgrader's Assignment List compares it with the exchange's copy, and a page that differs
is listed as "feedback updated" instead of offering "view feedback".

Selected by nbgrader's config (`ExchangeFactory.release_feedback` / `.fetch_feedback`,
autograder.course.hub.nbgrader_hub_config and nbgrader_setup.instructor_config).
"""
from __future__ import annotations

import os
from pathlib import Path

from nbgrader.exchange.default.fetch_feedback import ExchangeFetchFeedback
from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback

from ..reports.mathjax import FETCHED_DIR, MARKER, install_mathjax

HEAD_BYTES = 64 * 1024   # a camp page carries its MathJax loader in <head>, in its first few KiB


class ReleaseFeedback(ExchangeReleaseFeedback):
    def copy_files(self):
        super().copy_files()
        for page in Path(self.dest_path).glob("*.html"):
            if page.is_file() and not page.is_symlink() and page.stat().st_uid == os.geteuid():
                os.chmod(page, 0o644)


class FetchFeedback(ExchangeFetchFeedback):
    def copy_files(self):
        super().copy_files()
        feedback = Path(self.dest_path)   # <lab>/feedback/, the pages in its <timestamp>/ folders
        pages = [feedback / timestamp / f"{notebook_id}.html" for notebook_id, timestamp, _ in self.feedback_files]
        if any(_loads_mathjax(page) for page in pages):
            install_mathjax(feedback / FETCHED_DIR)


def _loads_mathjax(page: Path) -> bool:
    """Whether `page` is a camp page that looks for the course's MathJax (read, never changed)."""
    if not page.is_file() or page.is_symlink():
        return False
    with open(page, "rb") as fh:
        return MARKER.encode() in fh.read(HEAD_BYTES)
