"""`camp start LAB`: a student's own copy of a released lab, where their work is safe.

labs/ is the course's: `camp build` rewrites it and `git pull` updates it, so work typed there is
overwritten or collides with the next pull. `camp start` copies the lab's released folder once into
`work/<lab name>/` (git-ignored: no pull or build ever touches it) and never over an existing copy.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from ..catalog import Lab

WORK_DIR = "work"   # at the repository root, listed in .gitignore


class StartError(Exception):
    """The copy was not made (the message says why and what to do)."""


def start_lab(lab: Lab, root: Path, into: Path | None = None) -> Path:
    """Copy labs/<name>/ to `into`/<name>/ (default work/ in the repository); the notebook's path."""
    released = lab.release_path(root)
    if not released.is_file():
        raise StartError(f"{lab.id} is not released yet ({released} is missing)")
    dest = (into or root / WORK_DIR) / lab.name
    if dest.exists() or dest.is_symlink():
        raise StartError(f"{dest} already exists: your copy is there (nothing was overwritten); "
                         f"to start over, move it away first")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(released.parent, dest, symlinks=True,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return dest / lab.notebook
