"""First program inside a grading sandbox. bwrap has already made the namespaces (mount, PID,
network with loopback only, IPC, UTS), the read-only view of the system and the course code,
and the system-call filter; it starts this as root with only CAP_SYS_ADMIN, CAP_SETUID,
CAP_SETGID, CAP_SETPCAP and CAP_CHOWN. This program:

1. mounts ONE size- and inode-limited tmpfs and binds its parts on /home/student (the
   student's folder and cwd), /tmp, /var/tmp and /dev/shm: every path the student can write shares one disk
   quota, lives in this sandbox's mount namespace only and vanishes with it (nothing for the
   grader to clean up, nothing for the next submission to find);
2. copies the submission and the lab's public files from the read-only staging bind into
   /home/student, then unmounts the staging bind, and matplotlib's font list made at setup
   (autograder.isolation.font_cache) into its MPLCONFIGDIR, so no sandbox scans the fonts again;
3. applies per-process rlimits, empties the capability bounding set, drops to the sandbox uid
   (no groups) and execs the student runner.

  python -I -m autograder.isolation.sandbox_init --uid U --staging DIR --disk-bytes B
         --disk-inodes I --limit NAME=VALUE... --keep COURSE_PATH... [--fonts DIR] -- COMMAND...
"""
from __future__ import annotations

import argparse
import ctypes
import os
import resource
import shutil
import signal
import stat
import sys
from pathlib import Path

LIMITS = {"as": resource.RLIMIT_AS, "cpu": resource.RLIMIT_CPU, "nproc": resource.RLIMIT_NPROC,
          "fsize": resource.RLIMIT_FSIZE, "nofile": resource.RLIMIT_NOFILE, "core": resource.RLIMIT_CORE}
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
MNT_DETACH = 2
PR_CAPBSET_DROP = 24
DISK = "/run/camp-disk"
KEEP = "/run/camp-keep"
WORK = "/home/student"
WRITABLE = {"work": [WORK], "tmp": ["/tmp", "/var/tmp"], "shm": ["/dev/shm"]}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise SystemExit(f"sandbox: {what}: {os.strerror(err)}")


def mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def unmount(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def writable_disk(uid: int, size: int, inodes: int, keep: list[str]) -> None:
    """One limited tmpfs behind every student-writable path. Course paths that lie under one
    of them (a checkout in a `mktemp -d` folder under /tmp, say) are bound back on top,
    read-only, in root-owned folders the student cannot rename."""
    covered = [k for k in keep if any(k == t or k.startswith(t.rstrip("/") + "/") for ts in WRITABLE.values() for t in ts)]
    stash = []
    if covered:   # the root is read-only: stash them on a small tmpfs of their own
        mount("camp-keep", KEEP, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0700")
    for i, path in enumerate(covered):
        os.makedirs(f"{KEEP}/{i}")
        mount(path, f"{KEEP}/{i}", None, MS_BIND | MS_REC)
        stash.append((f"{KEEP}/{i}", path))
    mount("camp-disk", DISK, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},nr_inodes={inodes},mode=0755")
    for part, targets in WRITABLE.items():
        path = f"{DISK}/{part}"
        os.mkdir(path)
        os.chmod(path, 0o700 if part == "work" else 0o1777)   # work is handed over after copy_in
        for target in targets:
            mount(path, target, None, MS_BIND)
    unmount(DISK)
    for source, path in stash:
        os.makedirs(path, mode=0o755, exist_ok=True)
        mount(source, path, None, MS_BIND | MS_REC)
        mount("none", path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        unmount(source)
    if covered:
        unmount(KEEP)


def copy_in(staging: Path, uid: int) -> None:
    """Regular files and folders of `staging` into the work folder, owned by the student (links skipped)."""
    for dirpath, dirnames, filenames in os.walk(staging):
        rel = os.path.relpath(dirpath, staging)
        dest = Path(WORK) / rel
        if rel != ".":
            dest.mkdir()
            os.chown(dest, uid, uid)
        for name in filenames:
            src = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(src).st_mode):
                shutil.copyfile(src, dest / name, follow_symlinks=False)
                os.chown(dest / name, uid, uid)
    os.chown(WORK, uid, uid)
    unmount(str(staging))


def seed_matplotlib(fonts: str, uid: int) -> None:
    """matplotlib's font lists in `fonts` (a read-only course path) into $MPLCONFIGDIR (on the
    writable tmpfs), owned by the student: their matplotlib finds its cache instead of scanning."""
    config = os.environ.get("MPLCONFIGDIR")
    if not config or not os.path.isdir(fonts):
        return
    os.makedirs(config, mode=0o700, exist_ok=True)   # on the fresh tmpfs: nothing of the student's is there yet
    for name in os.listdir(fonts):
        src = os.path.join(fonts, name)
        if name.startswith("fontlist-") and name.endswith(".json") and stat.S_ISREG(os.lstat(src).st_mode):
            shutil.copyfile(src, os.path.join(config, name), follow_symlinks=False)
            os.chown(os.path.join(config, name), uid, uid)
    os.chown(config, uid, uid)   # last: root here cannot write into a folder it no longer owns


def drop_privileges(uid: int) -> None:
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: no such cap
            break
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
        raise SystemExit("sandbox: could not drop privileges")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--staging", required=True)
    parser.add_argument("--disk-bytes", type=int, required=True)
    parser.add_argument("--disk-inodes", type=int, required=True)
    parser.add_argument("--limit", action="append", default=[])
    parser.add_argument("--keep", action="append", default=[])
    parser.add_argument("--fonts", default="")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.uid <= 0:
        raise SystemExit("sandbox: refusing to run student code as root")
    # What this program creates must be open to the sandbox's uid whatever the grader's umask:
    # under `umask 077` the folders leading to a checkout under /tmp (a `mktemp -d` clone,
    # re-bound below) were made 0700 and the student's process could not import the course.
    os.umask(0o022)

    writable_disk(args.uid, args.disk_bytes, args.disk_inodes, args.keep)
    copy_in(Path(args.staging), args.uid)
    if args.fonts:
        seed_matplotlib(args.fonts, args.uid)
    for item in args.limit:
        name, value = item.split("=")
        resource.setrlimit(LIMITS[name], (int(value), int(value)))
    drop_privileges(args.uid)
    os.chdir(WORK)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized output fails the write, not the process
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
