"""When an upload was turned in: the time nbgrader's Formgrader shows for a submission and the
one it compares with the gradebook's to tell "graded" from "needs autograding".

nbgrader's submit and collect write it into the submission's folder as `timestamp.txt`; an
upload that came another way (a zip from a learning platform, a folder copied by hand) has
none, and its time is the upload's own modification time (the newest notebook of a lab folder,
or the .zip), read with lstat, never following a link. `camp grade` writes the time it used
into its copy of the submission, in one format nbgrader parses back to the same instant, so
Formgrader, the gradebook and the grade sheet agree. Like everything in an upload, a
timestamp.txt is the student's text: it is read with a byte bound, and one that does not hold a
time is replaced by the upload's modification time.
"""
from __future__ import annotations

import datetime
import os
import stat
from pathlib import Path

from .files import SubmissionError, read_bounded

STAMP = "timestamp.txt"
STAMP_BYTES = 100
_FORMAT = "%Y-%m-%d %H:%M:%S.%f UTC"


def read_stamp(folder: Path) -> datetime.datetime | None:
    """The time (naive UTC, as nbgrader stores it) in `folder`/timestamp.txt; None when there
    is none or it holds no time."""
    from nbgrader.utils import parse_utc

    try:
        text = read_bounded(Path(folder) / STAMP, STAMP_BYTES).decode("utf-8")
        return parse_utc(text.strip())
    except (OSError, SubmissionError, UnicodeDecodeError, ValueError, OverflowError, TypeError):
        return None


def upload_mtime(submissions_dir: Path, student: str, lab_folders: tuple[str, ...] = ()) -> datetime.datetime:
    """When `student` last changed the upload: the newest notebook in their lab folder (the
    first of `lab_folders` that exists: a lab's id or name) or that folder, else their .zip or
    folder; now when none can be read."""
    base = Path(submissions_dir)
    candidates = [base / student / name for name in lab_folders] + [base / f"{student}.zip", base / student]
    for path in candidates:
        try:
            st = os.lstat(path)
        except (OSError, ValueError):
            continue
        newest = st.st_mtime
        if stat.S_ISDIR(st.st_mode) and path.parent != base:   # a lab folder: its notebooks' time
            try:
                with os.scandir(path) as it:
                    times = [e.stat(follow_symlinks=False) for e in it if e.name.endswith(".ipynb")]
                newest = max((t.st_mtime for t in times if stat.S_ISREG(t.st_mode)), default=newest)
            except OSError:
                pass
        elif not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            continue
        try:
            return datetime.datetime.fromtimestamp(newest, datetime.timezone.utc).replace(tzinfo=None)
        except (OverflowError, OSError, ValueError):
            continue
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)


def write_stamp(folder: Path, when: datetime.datetime) -> None:
    """Write `when` (naive UTC) as `folder`/timestamp.txt, replacing what was there."""
    path = Path(folder) / STAMP
    path.unlink(missing_ok=True)
    path.write_text(when.strftime(_FORMAT) + "\n", encoding="utf-8")


def record_turned_in(folder: Path, submissions_dir: Path, student: str,
                     lab_folders: tuple[str, ...] = ()) -> datetime.datetime:
    """The submission's time, written into `folder` (the workspace's copy of the upload): its
    own timestamp.txt when that holds a time, else the upload's modification time."""
    when = read_stamp(folder) or upload_mtime(submissions_dir, student, lab_folders)
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_stamp(folder, when)
    return when
