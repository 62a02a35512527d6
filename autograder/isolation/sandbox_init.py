"""First program inside a grading sandbox (runs as root in fresh mount, network and PID
namespaces made by `unshare`): bring up loopback (only), hide what the student must not see, drop to an unprivileged
user, apply resource limits, then exec the student runner.

  python -m autograder.isolation.sandbox_init --uid U --scratch DIR --hide PATH... --expose PATH...
         --limit NAME=VALUE... -- COMMAND...

Hidden paths get an empty tmpfs of mode 000 mounted over them. Exposed paths (the Python
installation, say, when it lives under a private home like /root) stay reachable even though
an ancestor is private: the ancestor is replaced by a tmpfs in which only the exposed path is
bind-mounted back. Nothing here is visible outside the namespace.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

LIMITS = {"as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU, "nproc": resource.RLIMIT_NPROC,
          "fsize": resource.RLIMIT_FSIZE, "nofile": resource.RLIMIT_NOFILE, "core": resource.RLIMIT_CORE}
PR_SET_NO_NEW_PRIVS = 38


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, stdout=subprocess.DEVNULL)


def private_ancestor(path: Path) -> Path | None:
    """The highest ancestor of `path` that other users cannot traverse, if any."""
    for parent in reversed(path.parents):
        if parent != Path("/") and not os.stat(parent).st_mode & 0o001:
            return parent
    return None


def expose(paths: list[Path]) -> None:
    """Make each path reachable by an unprivileged user although an ancestor is private."""
    by_ancestor: dict[Path, list[Path]] = {}
    for p in paths:
        anc = private_ancestor(p)
        if anc is not None:
            by_ancestor.setdefault(anc, []).append(p)
    for anc, inside in by_ancestor.items():
        staging = Path(tempfile.mkdtemp(prefix="camp-expose-"))
        for i, p in enumerate(inside):
            (staging / str(i)).mkdir()
            mount("--bind", str(p), str(staging / str(i)))
        mount("-t", "tmpfs", "-o", "mode=755,size=1m", "camp-hidden", str(anc))
        for i, p in enumerate(inside):
            p.mkdir(parents=True, exist_ok=True)
            mount("--move", str(staging / str(i)), str(p))


def hide(paths: list[Path]) -> None:
    for p in paths:
        if p.is_dir():
            mount("-t", "tmpfs", "-o", "mode=000,size=1k", "camp-hidden", str(p))
        elif p.exists():
            mount("--bind", "/dev/null", str(p))


def loopback_up() -> None:
    """Bring up `lo` in the new network namespace (it starts down): ranks of a distributed test
    talk over 127.0.0.1, and nothing else is reachable from this namespace."""
    import fcntl
    import socket
    import struct
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, siocgifflags, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH", b"lo", flags | iff_up))


def drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("sandbox: could not drop privileges")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--hide", action="append", default=[])
    parser.add_argument("--expose", action="append", default=[])
    parser.add_argument("--limit", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    mount("--make-rprivate", "/")
    expose([Path(p) for p in args.expose])
    hide([Path(p) for p in args.hide])
    os.chdir(args.scratch)
    loopback_up()
    drop_privileges(args.uid)
    for item in args.limit:
        name, value = item.split("=")
        resource.setrlimit(LIMITS[name], (int(value), int(value)))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized output fails the write, not the process
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
