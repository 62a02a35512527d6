"""How `camp` drives nbgrader: one function builds the traitlets config for a course folder, so
build and grade configure nbgrader the same way (through its API, never by copying files by
hand into its folders)."""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from traitlets.config import Config


def put_environment_on_path() -> None:
    """nbgrader runs `alembic` and kernels by name from PATH: make sure they are this
    environment's, even when `camp` is called as .venv/bin/camp without activation."""
    bin_dir = str(Path(sys.executable).parent)
    parts = os.environ.get("PATH", "").split(os.pathsep)
    if parts[:1] != [bin_dir]:
        os.environ["PATH"] = os.pathsep.join([bin_dir] + [p for p in parts if p != bin_dir])


def nbgrader_config(root: Path, *, source: str | Path = "source", release: str | Path = "release",
                    db_path: Path | None = None, cell_timeout: int = 120) -> Config:
    """Config for an nbgrader course rooted at `root`.

    `source`/`release` are relative to `root` or absolute. The gradebook is sqlite at `db_path`
    (default `root/gradebook.db`). `cell_timeout` applies when nbgrader itself executes notebooks.
    """
    c = Config()
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.source_directory = str(source)
    c.CourseDirectory.release_directory = str(release)
    c.CourseDirectory.db_url = f"sqlite:///{db_path or Path(root) / 'gradebook.db'}"
    c.Execute.timeout = cell_timeout
    c.Execute.kernel_name = "python3"
    c.NbGraderAPI.log_level = "WARN"
    return c


def alembic_head_in_process() -> None:
    """Make nbgrader find its gradebook schema version without running `alembic` by name.

    A new gradebook asks `nbgrader.api.get_alembic_version()`, which starts the `alembic`
    command in a subprocess (seconds of start-up on every new gradebook: each `camp build`, each
    grading workspace), and fails where the environment's bin is not on PATH. The head revision
    comes from nbgrader's own migration scripts, so reading them here gives the same answer."""
    import nbgrader.api

    if getattr(nbgrader.api.get_alembic_version, "in_process", False):
        return

    @functools.lru_cache(maxsize=1)
    def get_alembic_version() -> str:
        from alembic.config import Config as AlembicConfig
        from alembic.script import ScriptDirectory

        cfg = AlembicConfig()
        cfg.set_main_option("script_location", str(Path(nbgrader.api.__file__).parent / "alembic"))
        (head,) = ScriptDirectory.from_config(cfg).get_heads()
        return head

    get_alembic_version.in_process = True
    nbgrader.api.get_alembic_version = get_alembic_version


def nbgrader_api(config: Config):
    """An `NbGraderAPI` for `config`. Its methods return {success, error, log} and never raise."""
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    put_environment_on_path()
    alembic_head_in_process()
    coursedir = CourseDirectory(config=config)
    return NbGraderAPI(coursedir=coursedir, config=config)
