"""Sandbox uids leased machine-wide: one uid per grading worker (or per running `Sandbox` that
was given none), never shared.

Why: a uid is what the kernel uses for process counts (RLIMIT_NPROC), signal permission and
file ownership. Two sandboxes with the same uid at the same time (two `camp grade` runs on one
machine: two courses, or a re-grade next to a grade) could signal or count against each other.
Each worker takes an exclusive `flock` on `<LOCK_DIR>/<uid>.lock` and keeps the file open for
its whole life; the kernel drops the lock when the worker dies, however it dies.
"""
from __future__ import annotations

import fcntl
import os
import pwd
import stat
from pathlib import Path

FIRST_UID = 61000
COUNT = 1000
LOCK_DIR = Path("/run/camp-sandbox-uids")


class UidsExhausted(RuntimeError):
    """Every uid of the range is leased (or the lock folder is unsafe)."""


def _safe_lock_dir(path: Path) -> Path:
    """The lock folder, made root-only; refused if anyone else could plant files in it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise UidsExhausted(f"{path} must be a folder owned by uid {os.geteuid()} with mode 0700")
    return path


def _unused_by_accounts(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return True
    return False


class UidLease:
    """An exclusively held sandbox uid; `release` (or process exit) gives it back."""

    def __init__(self, lock_dir: Path = LOCK_DIR, first: int = FIRST_UID, count: int = COUNT):
        folder = _safe_lock_dir(lock_dir)
        for uid in range(first, first + count):
            if not _unused_by_accounts(uid):
                continue
            fd = os.open(folder / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise UidsExhausted(f"all sandbox uids {first}..{first + count - 1} are in use (locks in {folder})")

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
