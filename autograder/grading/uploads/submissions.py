"""A class's uploads: one folder or .zip per student, each checked and copied into scratch space,
each problem one student's `Rejected`."""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from ...catalog import GradingCaps
from ...text import inert
from .files import SubmissionError, copy_tree, ignored, read_bounded, remove_tree
from .notebooks import check_notebook
from .zips import unzip

STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")   # always fullmatch: `$` accepts "victim\n"


@dataclass(frozen=True)
class Submission:
    student: str
    lab: str          # folder name as submitted (a lab id or name, resolved by the caller)
    path: Path        # checked copy of the folder holding the notebook(s)


@dataclass(frozen=True)
class Rejected:
    student: str      # made inert when the id itself is invalid
    reason: str
    lab: str = ""     # the lab folder the problem is in, "" when it concerns the whole upload
    valid_id: bool = True


def collect(submissions_dir: Path, scratch: Path,
            caps: GradingCaps = GradingCaps()) -> tuple[list[Submission], list[Rejected]]:
    """All (student, lab) submissions under `submissions_dir`, each checked and copied (folders)
    or unpacked (zips) into `scratch`/<student>; every problem is one student's `Rejected`."""
    found: list[Submission] = []
    rejected: list[Rejected] = []
    seen: set[str] = set()
    scratch.mkdir(parents=True, exist_ok=True)
    with os.scandir(submissions_dir) as it:
        entries = sorted(it, key=lambda e: os.fsencode(e.name))
    for entry in entries:
        if ignored(entry.name):
            continue
        student = entry.name[:-4] if entry.name.endswith(".zip") else entry.name
        if not STUDENT_ID.fullmatch(student):
            rejected.append(Rejected(inert(entry.name, 80), f"{inert(entry.name, 80)!r} is not a valid student id "
                                     "(1-64 letters, digits, _ . @ -)", valid_id=False))
            continue
        if student in seen:
            rejected.append(Rejected(student, f"submitted twice ({inert(entry.name)} and another folder or .zip): "
                                     "only the first was graded"))
            continue
        seen.add(student)
        stage = scratch / student
        try:
            remove_tree(stage)
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise SubmissionError("is a symbolic link: submissions must be plain folders or .zip files")
            if stat.S_ISDIR(st.st_mode):
                copy_tree(Path(entry.path), stage, caps, strict=True)
                root = stage
            elif stat.S_ISREG(st.st_mode) and entry.name.endswith(".zip"):
                unzip(Path(entry.path), stage, caps)
                inner = [d for d in stage.iterdir()]
                root = inner[0] if len(inner) == 1 and inner[0].is_dir() and inner[0].name == student else stage
            else:
                raise SubmissionError("is neither a folder nor a .zip file")
        except SubmissionError as exc:
            rejected.append(Rejected(student, str(exc)))
            remove_tree(stage)
            continue
        except OSError as exc:  # unreadable entry, disk full...: this student only
            rejected.append(Rejected(student, f"cannot be read ({type(exc).__name__}: {inert(exc.strerror or exc, 120)})"))
            remove_tree(stage)
            continue
        labs = sorted(d for d in root.iterdir() if d.is_dir())
        if not labs:
            rejected.append(Rejected(student, "holds no lab folder (expected <student>/<lab>/<notebook>.ipynb)"))
        for lab in labs:
            problem = _lab_problem(lab, caps)
            if problem:
                rejected.append(Rejected(student, problem, lab=lab.name))
            else:
                found.append(Submission(student, lab.name, lab))
    return found, rejected


def _lab_problem(folder: Path, caps: GradingCaps) -> str:
    """Why the lab folder cannot be graded ("" if it can): no notebook, or a notebook over a cap."""
    notebooks = sorted(p for p in folder.iterdir() if p.name.endswith(".ipynb") and p.is_file())
    if not notebooks:
        return f"lab folder {inert(folder.name, 80)!r} holds no notebook (.ipynb)"
    for nb in notebooks:
        try:
            check_notebook(read_bounded(nb, caps.notebook_bytes), caps, nb.name)
        except SubmissionError as exc:
            return str(exc)
    return ""
