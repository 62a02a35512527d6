"""Starting, talking to and ending the isolated process that holds one student's code.

Isolation "namespace" (needs root and util-linux `unshare`): new network namespace (no
network), new PID namespace (ending its first process ends every process the student started),
new mount namespace in which the course's solutions, hidden tests, git history and the grading
workspace are hidden; the code runs as an unprivileged uid (one per parallel job) with
no-new-privileges, resource limits (memory, CPU time, processes, file size, open files) and
a wall-clock deadline per request enforced from outside.

Isolation "none" (anywhere else): the same process with resource limits in its own session,
killed as a process group. It can read what the grader's user can read: use it only for
trusted code (a student's self-check, CI on reference solutions).
"""
from __future__ import annotations

import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..grading.wire import WireError, read_message, write_message

BASE_UID = 61000


@dataclass(frozen=True)
class Limits:
    cell_seconds: float = 120.0      # wall time for one cell or one test request
    notebook_seconds: float = 900.0  # wall time for everything one submission runs
    cpu_seconds: int = 1800
    memory_mb: int = 8192            # address space; torch needs a few GB of it
    processes: int = 256             # threads count too
    output_mb: int = 16              # largest file the student's code may write
    open_files: int = 256


class StudentCrashed(RuntimeError):
    """The student's process died or stopped answering (crash, os._exit, OOM kill, timeout)."""


@functools.lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """True when this process can make the namespaces a sandbox needs (root + unshare)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "true"],
                           capture_output=True, timeout=20)
    return probe.returncode == 0


def sandbox_env(scratch: Path, threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS_", "LC_", "LANG"))}
    bin_dir = str(Path(sys.executable).parent)
    env.update(PATH=f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", HOME=str(scratch), TMPDIR=str(scratch),
               MPLBACKEND="Agg", MPLCONFIGDIR=str(scratch / ".matplotlib"), IPYTHONDIR=str(scratch / ".ipython"),
               HF_HOME=str(scratch / ".hf"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONDONTWRITEBYTECODE="1",
               PYTHONNOUSERSITE="1", CAMP_GRADING="1")
    env.setdefault("LANG", "C.UTF-8")
    return env


class Sandbox:
    """One student's process. `request` sends a message and waits for the answer under a deadline."""

    def __init__(self, scratch: Path, *, isolation: str, slot: int = 0, hide: list[Path] = (),
                 limits: Limits = Limits(), forbid: list[str] = (), threads: int = 1):
        self.scratch, self.isolation, self.slot = scratch, isolation, slot
        self.hide, self.limits, self.forbid, self.threads = list(hide), limits, list(forbid), threads
        self.proc: subprocess.Popen | None = None

    @property
    def uid(self) -> int:
        return BASE_UID + self.slot

    def command(self) -> list[str]:
        runner = [sys.executable, "-I", "-m", "autograder.isolation.student_process", json.dumps({"forbid": self.forbid})]
        if self.isolation == "none":
            return runner
        lim = self.limits
        limits = {"as": lim.memory_mb * 2**20, "cpu": lim.cpu_seconds, "nproc": lim.processes,
                  "fsize": lim.output_mb * 2**20, "nofile": lim.open_files, "core": 0}
        expose = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.executable).resolve().parent}
        return (["unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
                 sys.executable, "-I", "-m", "autograder.isolation.sandbox_init", "--uid", str(self.uid),
                 "--scratch", str(self.scratch)]
                + [f"--hide={p}" for p in self.hide] + [f"--expose={p}" for p in sorted(expose)]
                + [f"--limit={k}={v}" for k, v in limits.items()] + ["--"] + runner)

    def start(self) -> None:
        self.close()
        self.scratch.mkdir(parents=True, exist_ok=True)
        if self.isolation == "namespace":
            for p in [self.scratch, *self.scratch.rglob("*")]:
                os.chown(p, self.uid, self.uid, follow_symlinks=False)
            os.chmod(self.scratch, 0o700)
        preexec = None if self.isolation == "namespace" else functools.partial(_limit_self, self.limits)
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(self.scratch / "sandbox.log", "ab"),
                                     cwd=self.scratch, env=sandbox_env(self.scratch, self.threads),
                                     start_new_session=True, preexec_fn=preexec)
        os.set_blocking(self.proc.stdout.fileno(), False)
        header, _ = self._read(time.monotonic() + 120)
        if not header.get("ready"):
            raise StudentCrashed("the grading process did not start")

    def request(self, header: dict, tensors=None, timeout: float | None = None):
        """Send one request; return (header, tensors). Raises StudentCrashed on death or timeout
        (the process is then killed; call start() again to continue)."""
        if self.proc is None or self.proc.poll() is not None:
            raise StudentCrashed("the student's process is not running")
        deadline = time.monotonic() + (timeout or self.limits.cell_seconds)
        try:
            _write_all(self.proc.stdin, header, tensors, deadline)
            return self._read(deadline)
        except StudentCrashed:
            self.close()
            raise

    def _read(self, deadline: float):
        reader = _DeadlineReader(self.proc, deadline, max(0.0, deadline - time.monotonic()))
        try:
            return read_message(reader)
        except EOFError:
            self.proc.wait(timeout=10)
            raise StudentCrashed(_death_message(self.proc.returncode)) from None
        except WireError as exc:
            raise StudentCrashed(f"the student's process sent a malformed answer ({exc})") from None

    def close(self) -> None:
        """Kill the student's process and everything it started."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self.proc = None


def _limit_self(limits: Limits) -> None:
    import resource
    for res, value in ((resource.RLIMIT_AS, limits.memory_mb * 2**20), (resource.RLIMIT_CPU, limits.cpu_seconds),
                       (resource.RLIMIT_FSIZE, limits.output_mb * 2**20), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(res, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _death_message(code: int | None) -> str:
    if code is not None and code < 0:
        name = signal.Signals(-code).name
        why = {"SIGKILL": "killed (out of memory, or over a limit)", "SIGSEGV": "crashed (segmentation fault)",
               "SIGXCPU": "used up its CPU time"}.get(name, f"was ended by {name}")
        return f"the student's process {why}"
    return f"the student's process exited (code {code}) — e.g. os._exit or sys.exit outside a function"


def _write_all(stream, header, tensors, deadline: float) -> None:
    import io
    buf = io.BytesIO()
    write_message(buf, header, tensors)
    data, fd = memoryview(buf.getvalue()), stream.fileno()
    os.set_blocking(fd, False)
    while data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StudentCrashed("the student's process stopped reading (timeout)")
        _, writable, _ = select.select([], [fd], [], left)
        if writable:
            try:
                data = data[os.write(fd, data):]
            except BrokenPipeError:
                raise StudentCrashed("the student's process is gone") from None


class _DeadlineReader:
    """File-like `read(n)` over a non-blocking pipe that gives up at `deadline`."""

    def __init__(self, proc, deadline: float, seconds: float):
        self.proc, self.deadline, self.seconds = proc, deadline, seconds

    def read(self, n: int) -> bytes:
        fd = self.proc.stdout.fileno()
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise StudentCrashed(f"timed out after {self.seconds:.0f} s (infinite loop? very slow code?)")
            readable, _, _ = select.select([fd], [], [], left)
            if readable:
                try:
                    return os.read(fd, n)
                except BlockingIOError:
                    continue
