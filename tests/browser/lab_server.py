"""`make lab` as a test drives it: the real Makefile target (ladder, instructor folders, the
server with the venv's bin on PATH, `ROLE` student or instructor), on a free loopback port with a
random token and no browser,
stopped through the server's own shutdown API (it ends its kernels and terminals) and, failing
that, by killing the process group."""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.support import free_port


class LabServer:
    def __init__(self, root: Path, env: dict[str, str], log: Path, role: str = "student"):
        self.root, self.env, self.log, self.role = root, env, log, role
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LabServer":
        args = (f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={self.port} "
                f"--ServerApp.port_retries=0 --IdentityProvider.token={self.token}")
        stamp = ".venv/.camp-installed"   # the Makefile's name for it: never reinstall from a test
        cmd = ["make", "--no-print-directory", "-o", stamp, "lab", f"ROLE={self.role}", f"LAB_ARGS={args}"]
        self._log_file = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=self.env, stdout=self._log_file,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(timeout=60)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def url(self, path: str) -> str:
        return f"{self.base}{path}{'&' if '?' in path else '?'}token={self.token}"

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"make lab exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url("/api/status"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"JupyterLab did not answer in {timeout:.0f} s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        try:
            req = urllib.request.Request(self.url("/api/shutdown"), method="POST")
            urllib.request.urlopen(req, timeout=5).close()
            self.proc.wait(timeout=20)
        except Exception:
            pass
        if self.proc.poll() is None or _group_alive(self.proc.pid):
            _kill_group(self.proc.pid)
            self.proc.wait(timeout=10)
        self._log_file.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(1)
