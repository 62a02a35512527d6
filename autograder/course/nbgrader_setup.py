"""How `camp` and the instructor's JupyterLab drive nbgrader.

`nbgrader_config` builds the traitlets config for a course folder, so build and grade configure
nbgrader the same way (through its API, never by copying files by hand into its folders).
`instructor_config` is what the repository's nbgrader_config.py loads for Formgrader and the
Validate button: the course is the repository (solutions/ -> labs/, every ready lab released
into the exchange by `make lab ROLE=instructor`: `release_ready_labs`), and collected submissions,
autograded notebooks, feedback and the gradebook live in the grading workspace that `camp grade` writes
(`grading_workspace`: ./grading, or $CAMP_GRADING_DIR), so both always read and write one place.
"""
from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from traitlets.config import Config

from .start import WORK_DIR

COURSE_ID = "llm-camp"   # nbgrader's course id: the exchange's folder name and the gradebook's course
GRADING_ENV = "CAMP_GRADING_DIR"    # where `camp grade` writes and Formgrader reads (default ./grading)
EXCHANGE_ENV = "CAMP_EXCHANGE_DIR"  # nbgrader's exchange (default ./exchange)
# The workspace's folder nbgrader calls "submitted": its collect writes there and so does
# `camp grade` (its checked copy of each upload it grades, with a timestamp.txt), so Formgrader
# counts and dates exactly the submissions `camp grade` graded.
SUBMITTED = "collected"


def submission_folder(workspace: Path, student: str, lab_name: str) -> Path:
    """Where the workspace keeps `student`'s submission of a lab (nbgrader's submitted folder)."""
    return Path(workspace) / SUBMITTED / student / lab_name


def grading_workspace(root: Path) -> Path:
    """The grading workspace: $CAMP_GRADING_DIR (relative paths are taken from the repository
    root, so the shell's folder never changes where grades go), else `root/grading`."""
    chosen = os.environ.get(GRADING_ENV, "").strip()
    return (Path(root) / (chosen or "grading")).resolve()


def exchange_root(root: Path) -> Path:
    """nbgrader's exchange folder (release -> fetch -> submit -> collect): $CAMP_EXCHANGE_DIR
    (relative to the repository root), else `root/exchange`."""
    chosen = os.environ.get(EXCHANGE_ENV, "").strip()
    return (Path(root) / (chosen or "exchange")).resolve()


def _step_dir(root: Path, folder: Path) -> str:
    """A folder for nbgrader's CourseDirectory: relative to the course root when inside it
    (nbgrader escapes only the root in the patterns it matches paths with), else absolute."""
    try:
        return str(folder.relative_to(Path(root).resolve()))
    except ValueError:
        return str(folder)


def instructor_config(root: Path) -> Config:
    """nbgrader's config for the instructor's JupyterLab (Formgrader, Validate, release/collect)."""
    root = Path(root).resolve()
    workspace = grading_workspace(root)
    c = Config()
    c.CourseDirectory.root = str(root)
    c.CourseDirectory.course_id = COURSE_ID
    c.CourseDirectory.source_directory = "solutions"
    c.CourseDirectory.release_directory = "labs"
    # nbgrader's "submitted": where its collect puts turned-in work (grade it with `camp grade
    # <workspace>/collected`) and where `camp grade` keeps what it graded
    c.CourseDirectory.submitted_directory = _step_dir(root, workspace / SUBMITTED)
    c.CourseDirectory.autograded_directory = _step_dir(root, workspace / "autograded")
    c.CourseDirectory.feedback_directory = _step_dir(root, workspace / "feedback")
    c.CourseDirectory.db_url = f"sqlite:///{workspace / 'gradebook.db'}"
    c.Exchange.root = str(exchange_root(root))
    c.ExchangeFactory.list = "autograder.course.exchange_list.ExchangeList"   # logs a listing once, not per page
    c.ExchangeFactory.fetch_feedback = "autograder.course.exchange_feedback.FetchFeedback"   # MathJax beside the page
    # a fetched assignment lands where `camp start` puts a student's copy: work/<lab>/, git-ignored,
    # never overwritten by camp build or git pull (and fetch, like camp start, keeps an existing copy)
    c.Exchange.assignment_dir = str(Path(root) / WORK_DIR)
    c.Execute.timeout = 120
    c.HTMLExporter.sanitize_html = True  # Formgrader renders students' markdown in the instructor's browser
    c.HTMLExporter.extra_template_basedirs = formgrader_template_dirs(root)
    return c


def formgrader_template_dirs(root: Path) -> list[str]:
    """nbconvert template folders for Formgrader's pages: the course's own first (its
    formgrade/mathjax.html.j2 loads MathJax from the server, not a CDN), then nbgrader's."""
    import nbgrader   # its templates' folder as nbgrader names it (server_extensions.formgrader.handlers)

    nbgrader_templates = Path(nbgrader.__file__).parent / "server_extensions" / "formgrader" / "templates"
    return [str(Path(root) / "course" / "jupyter" / "templates"), str(nbgrader_templates)]


def prepare_instructor_folders(root: Path) -> tuple[Path, Path]:
    """Create the grading workspace (private to its owner) and the exchange with the modes
    nbgrader's own release step gives them: the root world-writable,
    `<course>/outbound` readable by all, `<course>/inbound` 2733 (students may drop files in,
    not list or read other students')."""
    root = Path(root).resolve()
    workspace = grading_workspace(root)
    if not workspace.exists():
        workspace.mkdir(parents=True)
        os.chmod(workspace, 0o700)
    exchange = exchange_root(root)
    modes = [(exchange, 0o777), (exchange / COURSE_ID, 0o755), (exchange / COURSE_ID / "outbound", 0o755),
             (exchange / COURSE_ID / "inbound", 0o2733)]
    for folder, mode in modes:
        if not folder.exists():
            folder.mkdir(parents=True)
            os.chmod(folder, mode)
    return workspace, exchange


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
    c.CourseDirectory.submitted_directory = SUBMITTED
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


def release_ready_labs(root: Path) -> tuple[list[str], str]:
    """Release every ready lab (its labs/ folder: what students already have) into the exchange
    that does not hold it yet, through nbgrader's own release, so Formgrader calls it released,
    not "draft" (and, with nothing released, nbgrader would list the exchange once per lab).
    Returns (the names released now, why it could not release: "" when it could)."""
    from ..catalog import Catalog

    root = Path(root).resolve()
    outbound = exchange_root(root) / COURSE_ID / "outbound"
    if not os.access(outbound, os.W_OK | os.X_OK):
        return [], f"{outbound} is not writable by this user (the course's instructor releases there)"
    api = None
    released = []
    for lab in Catalog.load(root / "course" / "labs.toml").ready():
        if (outbound / lab.name).exists() or not lab.release_path(root).is_file():
            continue
        api = api or nbgrader_api(instructor_config(root))
        result = api.release_assignment(lab.name)
        if not result["success"]:
            return released, f"nbgrader could not release {lab.name}: " + \
                (result.get("error") or result.get("log") or "").strip()[-300:]
        released.append(lab.name)
    return released, ""


def main(argv: list[str] | None = None) -> int:
    """`python -m autograder.course.nbgrader_setup [--role student|instructor]` (run by `make
    lab`): create the instructor's folders, release the ready labs for an instructor, and say
    where things are."""
    import argparse

    from ..catalog import repo_root

    parser = argparse.ArgumentParser(prog="python -m autograder.course.nbgrader_setup")
    parser.add_argument("--role", choices=("student", "instructor"), default="student")
    args = parser.parse_args(argv)
    root = repo_root()
    workspace, exchange = prepare_instructor_folders(root)
    if args.role == "student":
        print(f"nbgrader: exchange {exchange} (${EXCHANGE_ENV}); Validate on every notebook. "
              "Instructors: make lab ROLE=instructor (Formgrader)")
        return 0
    released, problem = release_ready_labs(root)
    print(f"nbgrader: grading workspace {workspace} (${GRADING_ENV}), exchange {exchange} (${EXCHANGE_ENV}); "
          "Formgrader: Nbgrader > Formgrader in JupyterLab"
          + (f"; released {len(released)} ready labs into the exchange" if released else ""))
    if problem:
        print(f"nbgrader: WARNING: {problem}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
