"""JupyterHub for a class (`make hub`, course/hub/jupyterhub_config.py).

Each student and instructor is a real local user (PAM logs them in with their own password) with
their own JupyterLab, started by LocalProcessSpawner as that user (the hub runs as root). Who may
log in is two Unix groups: the class's students ($CAMP_HUB_STUDENTS, default `llm-camp-students`)
and its instructors ($CAMP_HUB_INSTRUCTORS, default `llm-camp-instructors`). Students open on their
home with the Assignment List (fetch, Validate, submit, fetch feedback); instructors open on the
course repository with Formgrader. nbgrader's exchange is one folder on this machine
($CAMP_EXCHANGE_DIR, default /srv/nbgrader/exchange: world-writable with the sticky bit, as
nbgrader documents), with `Exchange.path_includes_course` so a student's copy is
`~/llm-camp/<lab>/`.

What stays private to the instructors (`prepare`, run by `make hub` as root): every top-level
folder of the repository but the ones a student's Python needs (`STUDENT_READABLE`), so
solutions/ (the hidden tests), .git, runs/ and the grading workspace (gradebook, collected work)
are closed to students by file modes, whatever a student types in a terminal; each home is made
0700 before its server starts (`pre_spawn`), so a classmate cannot read a fetched or submitted
copy there. Submissions sit in the exchange's inbound folder (students may add, not list: 2733)
under names holding 72 random bits; released feedback in its feedback folder (0711), one file per
submission named by a hash of that submission's own secret, so each student finds only theirs.
"""
from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from ..grading.uploads import share_with_group
from .nbgrader_setup import COURSE_ID, EXCHANGE_ENV, GRADING_ENV, exchange_root, grading_workspace

STUDENTS_ENV, INSTRUCTORS_ENV = "CAMP_HUB_STUDENTS", "CAMP_HUB_INSTRUCTORS"
STATE_ENV = "CAMP_HUB_STATE"            # the hub's database, cookie secret, proxy pid: root only
DEFAULT_EXCHANGE = "/srv/nbgrader/exchange"
DEFAULT_STATE = "/srv/llm-camp-hub"
# What a student's JupyterLab needs from the repository: the Python environment, the course's
# packages (imported from here by the editable install), its Jupyter settings and catalog, the
# released labs. Every other top-level folder is for instructors only.
STUDENT_READABLE = frozenset({".venv", "camplib", "autograder", "course", "labs"})
PROXY_PACKAGE = "node-configurable-http-proxy"   # Debian's build of JupyterHub's proxy


def group_names() -> tuple[str, str]:
    """(students' group, instructors' group)."""
    return (os.environ.get(STUDENTS_ENV, "").strip() or "llm-camp-students",
            os.environ.get(INSTRUCTORS_ENV, "").strip() or "llm-camp-instructors")


def members(group: str) -> set[str]:
    """The users in Unix `group`, as a supplementary or as their primary group."""
    try:
        g = grp.getgrnam(group)
    except KeyError:
        return set()
    return set(g.gr_mem) | {p.pw_name for p in pwd.getpwall() if p.pw_gid == g.gr_gid}


def hub_exchange(root: Path) -> Path:
    """The class's exchange: $CAMP_EXCHANGE_DIR, else /srv/nbgrader/exchange (not the
    repository's exchange/, which is for `make lab` on one's own machine)."""
    if not os.environ.get(EXCHANGE_ENV, "").strip():
        return Path(DEFAULT_EXCHANGE)
    return exchange_root(root)


def state_dir() -> Path:
    return Path(os.environ.get(STATE_ENV, "").strip() or DEFAULT_STATE)


def private_folders(root: Path) -> list[Path]:
    """The repository's top-level folders students must not read, and the grading workspace."""
    root = Path(root).resolve()
    found = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and p.name not in STUDENT_READABLE)
    workspace = grading_workspace(root)
    if workspace not in found and not any(f in workspace.parents for f in found):
        found.append(workspace)
    return found


def needed_by_students(root: Path) -> list[Path]:
    """Folders every user must be able to enter: the repository and the Python installation the
    course's environment is made from (a pyenv under /root, 0700, is not)."""
    return [Path(root).resolve(), Path(sys.base_prefix).resolve()]


def unreachable(root: Path) -> Path | None:
    """The first folder on the way to the repository or the course's Python, or in
    STUDENT_READABLE, that other users cannot enter (students' Python would not start), or None."""
    root = Path(root).resolve()
    for needed in needed_by_students(root):
        for folder in [*reversed(needed.parents), needed]:
            if os.stat(folder).st_mode & 0o001 == 0:
                return folder
    for name in sorted(STUDENT_READABLE):
        p = root / name
        if p.exists() and os.stat(p).st_mode & 0o005 != 0o005:
            return p
    return None


def install_proxy() -> str:
    """configurable-http-proxy on PATH, installed from Debian when missing (as root)."""
    found = shutil.which("configurable-http-proxy")
    if found:
        return found
    if not shutil.which("apt-get"):
        raise SystemExit(f"make hub: configurable-http-proxy is missing and apt-get is not here: install {PROXY_PACKAGE} "
                         "(or `npm install -g configurable-http-proxy`)")
    print(f"make hub: installing Debian's {PROXY_PACKAGE} (JupyterHub's proxy)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "install", "-y", "-qq", PROXY_PACKAGE], check=False, env=env, stdout=subprocess.DEVNULL)
    if not shutil.which("configurable-http-proxy"):   # a stale package list: update once, then again
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", PROXY_PACKAGE], check=True, env=env, stdout=subprocess.DEVNULL)
    return shutil.which("configurable-http-proxy") or "configurable-http-proxy"


def proxy_environment() -> None:
    """Debian's configurable-http-proxy loads its modules (commander, http-proxy...) from
    /usr/share/nodejs, which only Debian's own node searches; with a node from elsewhere
    (NodeSource's, as here) the proxy fails with "Cannot find module 'commander'" unless NODE_PATH
    names that folder. The hub passes its environment on to the proxy."""
    found = shutil.which("configurable-http-proxy")
    debian_modules = "/usr/share/nodejs"
    if found and os.path.realpath(found).startswith(debian_modules + "/"):
        parts = [p for p in os.environ.get("NODE_PATH", "").split(os.pathsep) if p]
        if debian_modules not in parts:
            os.environ["NODE_PATH"] = os.pathsep.join([*parts, debian_modules])


def prepare(root: Path) -> list[str]:
    """Everything the hub needs before it starts (root only; idempotent). Returns what it did."""
    root = Path(root).resolve()
    students, instructors = group_names()
    done = [f"proxy: {install_proxy()}"]
    blocked = unreachable(root)
    if blocked is not None:
        raise SystemExit(f"make hub: other users cannot enter {blocked}, so students' JupyterLab could not start: "
                         f"put the course and the Python its .venv was made from where every user can reach them "
                         "(e.g. the course in /srv/llm-camp, `make setup PYTHON=/usr/bin/python3`), or `chmod o+x` the folders above them")
    for group in (students, instructors):
        try:
            grp.getgrnam(group)
        except KeyError:
            subprocess.run(["groupadd", group], check=True)
            done.append(f"created group {group}")
    gid = grp.getgrnam(instructors).gr_gid
    for folder in private_folders(root):
        if not folder.exists():
            folder.mkdir(parents=True)
        os.chown(folder, -1, gid)   # instructors (Formgrader) read it; the owner keeps its own bits
        os.chmod(folder, (stat.S_IMODE(os.stat(folder).st_mode) & 0o700) | 0o050)
        done.append(f"private to {instructors}: {folder}")
    workspace = grading_workspace(root)
    os.chmod(workspace, 0o2770)     # shared by the instructors (setgid): collect, Formgrader, `sudo camp grade`
    share_with_group(workspace)     # what root graded there before (`make lab` days) becomes theirs too
    exchange = hub_exchange(root)
    exchange.mkdir(parents=True, exist_ok=True)
    os.chmod(exchange, 0o1777)      # world-writable with the sticky bit (nbgrader's shared exchange)
    done.append(f"exchange: {exchange} (1777)")
    state = state_dir()
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o700)
    done.append(f"hub state: {state} (0700, root)")
    return done


def pre_spawn(spawner) -> None:
    """Before a user's JupyterLab starts: their home closed to classmates, and their role's
    settings (students: their home, no instructor tools; instructors: the course, Formgrader)."""
    from ..catalog import repo_root

    root = repo_root()
    user = pwd.getpwnam(spawner.user.name)
    home = Path(user.pw_dir)
    if home.is_dir() and stat.S_IMODE(os.stat(home).st_mode) & 0o077:
        os.chmod(home, 0o700)
        spawner.log.info("camp hub: %s's home %s made 0700 (classmates could read it)", user.pw_name, home)
    role = "instructor" if user.pw_name in members(group_names()[1]) else "student"
    jupyter = root / "course" / "jupyter"
    config = [root / "course" / "hub" / "jupyter", *([jupyter / "student"] if role == "student" else []), jupyter / "everyone"]
    venv_bin = Path(sys.executable).parent
    spawner.environment.update({
        "CAMP_HUB_ROLE": role,
        "JUPYTER_CONFIG_PATH": os.pathsep.join(str(p) for p in config),
        EXCHANGE_ENV: str(hub_exchange(root)),
        GRADING_ENV: str(grading_workspace(root)),
        "PATH": os.pathsep.join([str(venv_bin), "/usr/local/bin", "/usr/bin", "/bin"]),
    })
    spawner.notebook_dir = str(root) if role == "instructor" else str(home)
    # terminals start the user's shell without -l, as `make lab` does: a login shell resets PATH
    # from /etc/profile, and `python`, `nbgrader`, `camp` would no longer be the course's
    shell = json.dumps({"shell_command": [user.pw_shell or "/bin/sh"]})
    spawner.args = [a for a in spawner.args if not a.startswith("--ServerApp.terminado_settings=")] + \
        [f"--ServerApp.terminado_settings={shell}"]


def nbgrader_hub_config():
    """nbgrader's settings in a hub user's JupyterLab (course/hub/jupyter/nbgrader_config.py)."""
    from traitlets.config import Config

    from ..catalog import repo_root
    from .nbgrader_setup import instructor_config

    root = repo_root()
    c = instructor_config(root) if os.environ.get("CAMP_HUB_ROLE") == "instructor" else Config()
    c.CourseDirectory.course_id = COURSE_ID
    c.Exchange.root = str(hub_exchange(root))
    c.Exchange.path_includes_course = True   # a student's copy: ~/llm-camp/<lab>/
    if os.environ.get("CAMP_HUB_ROLE") != "instructor":
        c.Exchange.assignment_dir = str(Path.home())
    c.ExchangeFactory.release_feedback = "autograder.course.exchange_feedback.ReleaseFeedback"
    c.ExchangeFactory.fetch_feedback = "autograder.course.exchange_feedback.FetchFeedback"   # MathJax beside the page
    return c


def main(argv: list[str] | None = None) -> int:
    """`python -m autograder.course.hub prepare` (run by `make hub` as root)."""
    import argparse

    from ..catalog import repo_root

    parser = argparse.ArgumentParser(prog="python -m autograder.course.hub")
    parser.add_argument("command", choices=("prepare",))
    parser.parse_args(argv)
    if os.geteuid() != 0:
        print("make hub: JupyterHub with real local users runs as root (PAM, one process per user): "
              "run `sudo make hub`", file=sys.stderr)
        return 2
    for line in prepare(repo_root()):
        print(f"make hub: {line}")
    students, instructors = group_names()
    print(f"make hub: {len(members(students))} students ({students}), {len(members(instructors))} instructors "
          f"({instructors}); add one: useradd -m -G {students} NAME && passwd NAME")
    return 0


if __name__ == "__main__":
    sys.exit(main())
