"""A class on this machine for tests/browser/test_hub_in_browser.py: throwaway local users (two
students, one instructor) in two throwaway groups, and `make hub` itself (prepare, then
JupyterHub as root) on free loopback ports with its exchange, grading workspace and state in a
temporary folder. Everything is undone on exit, whatever happened: the hub and every process of
the throwaway users stopped, the users (with their homes) and groups deleted, the repository's
folder modes put back (`make hub` closes them to students), the temporary folder removed.

The hub runs under `umask 077`, as on a hardened machine: nbgrader's exchange must work anyway.
"""
from __future__ import annotations

import os
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from autograder.course import hub
from tests.support import free_port

from .lab_server import _group_alive, _kill_group

STAMP = ".venv/.camp-installed"   # the Makefile's name for it: never reinstall from a test


class HubClass:
    def __init__(self, root: Path, log: Path):
        self.root, self.log = Path(root), log
        tag = secrets.token_hex(3)   # unique names: two runs (or a leftover) never collide
        self.students_group, self.instructors_group = f"campst{tag}", f"campin{tag}"
        self.students, self.instructor = [f"ada{tag}", f"bob{tag}"], f"tea{tag}"
        self.password = secrets.token_urlsafe(16)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="camp-hub-"))
        self.exchange, self.workspace, self.state = self.dir / "exchange", self.dir / "grading", self.dir / "state"
        self.proc: subprocess.Popen | None = None
        self.views = False
        self._background: list[subprocess.Popen] = []
        self._made_users: list[str] = []
        self._made_groups: list[str] = []
        self._modes: dict[Path, tuple[int, int]] = {}

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "CAMP_"))}
        env.update(CAMP_HUB_STUDENTS=self.students_group, CAMP_HUB_INSTRUCTORS=self.instructors_group,
                   CAMP_EXCHANGE_DIR=str(self.exchange), CAMP_GRADING_DIR=str(self.workspace),
                   CAMP_HUB_STATE=str(self.state), CAMP_HUB_PORT=str(self.port),
                   CAMP_HUB_API_PORT=str(free_port()), CAMP_HUB_PROXY_API_PORT=str(free_port()))
        return env

    def __enter__(self) -> "HubClass":
        try:
            os.chmod(self.dir, 0o711)   # users reach the exchange and workspace below; nobody lists it
            for top in self.root.iterdir():
                if top.is_dir() and not top.is_symlink():
                    st = os.stat(top)
                    self._modes[top] = (st.st_mode & 0o7777, st.st_gid)
            for group in (self.students_group, self.instructors_group):
                subprocess.run(["groupadd", group], check=True)
                self._made_groups.append(group)
            for user, group in [(s, self.students_group) for s in self.students] + [(self.instructor, self.instructors_group)]:
                subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--groups", group, user], check=True)
                self._made_users.append(user)
                subprocess.run(["chpasswd"], input=f"{user}:{self.password}\n", text=True, check=True)
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        self._log_file = open(self.log, "w")
        make = ["make", "--no-print-directory", "-o", STAMP, "hub"]
        views = self._views()
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-ec", f'umask 022; {views} umask 077; exec "$@"', "sh", *make] if views else make
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=self.env,
                                     stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=lambda: os.umask(0o077))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"make hub exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base}/hub/api", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"JupyterHub did not answer in 90 s:\n{self.output()[-3000:]}")

    def _views(self) -> str:
        """Shell commands giving the hub (and every process it starts) a view in which the folders
        that close the course's Python or the repository to other users (this machine's Python is
        a pyenv in /root, 0700) are a tmpfs holding only the way through: the hub's own mount
        namespace, so nothing changes for the rest of the machine. Empty when nothing blocks.
        A real class installs the course where users reach it instead (`make hub` says so)."""
        by_block: dict[Path, list[Path]] = {}
        for needed in hub.needed_by_students(self.root):
            blocked = next((f for f in [*reversed(needed.parents), needed] if os.stat(f).st_mode & 0o001 == 0), None)
            if blocked is not None and blocked != needed:
                by_block.setdefault(blocked, []).append(needed)
        lines = []
        for n, (blocked, inside) in enumerate(sorted(by_block.items())):
            stash = self.dir / f"view{n}"
            for i, path in enumerate(inside):
                lines.append(f"mkdir -p {stash}/{i}; mount --bind {shlex.quote(str(path))} {stash}/{i};")
            lines.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(blocked))};")
            for i, path in enumerate(inside):
                lines.append(f"mkdir -p {shlex.quote(str(path))}; mount --bind {stash}/{i} {shlex.quote(str(path))};")
        self.views = bool(lines)
        return " ".join(lines)

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")

    def home(self, user: str) -> Path:
        return Path(pwd.getpwnam(user).pw_dir)

    def uid(self, user: str) -> int:
        return pwd.getpwnam(user).pw_uid

    def memory_mib(self, user: str) -> float:
        """Resident memory of every process running as `user` (their JupyterLab), in MiB."""
        total = 0
        for pid in _pids_of(self.uid(user)):
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        return round(total / 1024, 1)

    def _user_command(self, user: str, cmd: tuple[str, ...]) -> dict:
        """`cmd` as `user` under umask 077, with what their hub JupyterLab's terminal has
        (autograder.course.hub.pre_spawn): the course's settings and PATH, in the repository
        for the instructor (as Formgrader does), in their home for a student; inside the hub's
        mount namespace when it has one."""
        role = "instructor" if user == self.instructor else "student"
        venv_bin = Path(self.root / ".venv" / "bin")
        env = {**self.env, "HOME": str(self.home(user)), "USER": user, "LOGNAME": user, "CAMP_HUB_ROLE": role,
               "JUPYTER_CONFIG_PATH": str(self.root / "course" / "hub" / "jupyter"),
               "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin"}
        cwd = self.root if role == "instructor" else self.home(user)
        # cd inside the namespace: nsenter's --wd opens the folder before entering it, and a folder
        # reached through the view's bind mount has no path there (getcwd fails: a clone in a
        # private mktemp folder)
        enter = (["nsenter", f"--target={self.proc.pid}", "--mount", "--", "sh", "-c", 'cd "$0" && exec "$@"', str(cwd)]
                 if self.views else [])
        runuser = shutil.which("runuser") or "/usr/sbin/runuser"
        argv = [*enter, runuser, "-u", user, "--", "sh", "-c", 'umask 077; exec "$@"', "sh", *cmd]
        return {"args": argv, "cwd": cwd, "env": env, "text": True}

    def as_user(self, user: str, *cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(**self._user_command(user, cmd), capture_output=True, timeout=timeout)

    def start_as_user(self, user: str, *cmd: str) -> subprocess.Popen:
        """The same, running in the background (read it with `.communicate()`)."""
        proc = subprocess.Popen(**self._user_command(user, cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._background.append(proc)
        return proc

    def __exit__(self, *exc) -> None:
        for proc in self._background:   # a step the test started and did not wait for (it failed first)
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)   # JupyterHub stops the users' servers and the proxy
                self.proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            if self.proc.poll() is None or _group_alive(self.proc.pid):
                _kill_group(self.proc.pid)
                self.proc.wait(timeout=10)
            self._log_file.close()
        for user in self._made_users:
            _kill_user_processes(pwd.getpwnam(user).pw_uid)
            subprocess.run(["userdel", "--remove", user], check=False, capture_output=True)
        for group in self._made_groups:
            subprocess.run(["groupdel", group], check=False, capture_output=True)
        for folder, (mode, gid) in self._modes.items():
            try:
                os.chown(folder, -1, gid)
                os.chmod(folder, mode)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


def _kill_user_processes(uid: int) -> None:
    """End every process running as `uid` (a throwaway user of this test), by its id."""
    for _ in range(2):
        pids = _pids_of(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)


def _pids_of(uid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids
