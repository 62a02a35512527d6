"""nbgrader's release_feedback, with each released page readable by its student whatever the
instructor's umask.

nbgrader copies a feedback page into the exchange's feedback folder (0711: nobody lists it) with
the mode of the instructor's file. Under `umask 077` (common on shared machines) that is 0600,
owned by the instructor: the student whose hash names the page cannot open it, and Fetch Feedback
fails. After nbgrader's own copy this makes every released page 0644; only someone who knows a
submission's secret can name one. Selected by the hub's nbgrader config
(`ExchangeFactory.release_feedback`, autograder.course.hub.nbgrader_hub_config).
"""
from __future__ import annotations

import os
from pathlib import Path

from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback


class ReleaseFeedback(ExchangeReleaseFeedback):
    def copy_files(self):
        super().copy_files()
        for page in Path(self.dest_path).glob("*.html"):
            if page.is_file() and not page.is_symlink() and page.stat().st_uid == os.geteuid():
                os.chmod(page, 0o644)
