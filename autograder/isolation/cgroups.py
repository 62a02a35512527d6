"""A CPU, memory and process budget of its own for each sandbox (Linux control groups).

Why: rlimits are per process (or per uid), so a submission that forks a hundred busy processes
or fills memory slows down or kills the classmate graded next to it. A cgroup caps the whole
sandbox: CPU to `cpus` cores (CFS quota), memory (the OOM killer picks inside the group only;
its tmpfs counts too), number of tasks; and it tells how much CPU the sandbox really got, so a
timeout can be told apart from starvation.

cgroup v2 is used when this process's cgroup can delegate cpu, memory and pids; otherwise the
v1 hierarchies (cpu, cpuacct, memory, pids). Groups are made below this process's own group
(so the machine's own limits still apply) as `camp-<name>`, and removed on `close`.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

V1_CONTROLLERS = ("cpu", "cpuacct", "memory", "pids")
PERIOD_US = 100_000


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, fs type, options) of the cgroup file systems."""
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            _, point, fstype, options, *_ = line.split()
            if fstype in ("cgroup", "cgroup2"):
                found.append((point.replace("\\040", " "), fstype, set(options.split(","))))
    return found


def _own_groups() -> dict[str, str]:
    """controller ('' for v2) -> this process's group path."""
    groups = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                groups[c] = path
    return groups


def _v2_parent() -> Path | None:
    own = _own_groups().get("")
    for point, fstype, _ in _mounts():
        if fstype != "cgroup2" or own is None:
            continue
        parent = Path(point) / own.lstrip("/")
        try:
            wanted = {"cpu", "memory", "pids"}
            if not wanted <= set((parent / "cgroup.controllers").read_text().split()):
                continue
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
            missing = wanted - enabled
            if missing:  # fails (EBUSY) when the parent holds processes and is not the root
                (parent / "cgroup.subtree_control").write_text(" ".join("+" + c for c in sorted(missing)))
            return parent
        except OSError:
            continue
    return None


def _v1_parents() -> dict[str, Path] | None:
    own = _own_groups()
    parents: dict[str, Path] = {}
    for point, fstype, options in _mounts():
        if fstype != "cgroup":
            continue
        for c in V1_CONTROLLERS:
            if c in options and c in own and c not in parents:
                parents[c] = Path(point) / own[c].lstrip("/")
    if set(parents) != set(V1_CONTROLLERS) or not all(os.access(p, os.W_OK) for p in parents.values()):
        return None
    return parents


def problem() -> str | None:
    """Why per-sandbox cgroups cannot be used here (None when they can)."""
    if os.geteuid() != 0:
        return "cgroups need root"
    try:
        if _v2_parent() is not None or _v1_parents() is not None:
            return None
    except OSError as exc:
        return f"cgroups are not readable ({exc})"
    return "no writable cgroup v2 (cpu, memory, pids) or v1 (cpu, cpuacct, memory, pids) hierarchy"


def _parents() -> list[Path]:
    v2 = _v2_parent()
    if v2 is not None:
        return [v2]
    return sorted(set((_v1_parents() or {}).values()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def sweep_orphans() -> None:
    """Remove the groups of graders that died without cleaning up (killed with SIGKILL, say):
    `camp-<uid>-<owner pid>-<n>` whose owner is gone."""
    for parent in _parents():
        for d in parent.glob("camp-*-*-*"):
            try:
                owner = int(d.name.split("-")[2])
            except ValueError:
                continue
            if not _alive(owner):
                orphan = Budget.__new__(Budget)
                orphan.dirs, orphan._usage = [d], None
                try:
                    orphan.close(wait=1.0)
                except OSError:
                    pass


class Budget:
    """One sandbox's group(s), named `camp-<uid>-<this pid>-<serial>`: made by `__init__`,
    joined by `join_self` (in the child before exec), measured by `cpu_seconds`, emptied and
    removed by `close`."""

    def __init__(self, uid: int, serial: int, *, cpus: float, memory_bytes: int, tasks: int):
        self.dirs: list[Path] = []
        self._usage: tuple[Path, float] | None = None  # (file, divisor to seconds)
        try:
            self._make(f"camp-{uid}-{os.getpid()}-{serial}", cpus, memory_bytes, tasks)
        except BaseException:
            self.close()
            raise

    def _make(self, name: str, cpus: float, memory_bytes: int, tasks: int) -> None:
        quota = max(1000, int(cpus * PERIOD_US))
        parent = _v2_parent()
        if parent is not None:
            d = parent / name
            d.mkdir(mode=0o700)
            self.dirs.append(d)
            (d / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            (d / "memory.max").write_text(str(memory_bytes))
            (d / "memory.swap.max").exists() and (d / "memory.swap.max").write_text("0")
            (d / "pids.max").write_text(str(tasks))
            self._usage = (d / "cpu.stat", 0.0)
            return
        parents = _v1_parents()
        if parents is None:
            raise OSError(problem())
        for p in parents.values():
            d = p / name
            if d in self.dirs:  # co-mounted controllers share one directory
                continue
            d.mkdir(mode=0o700)
            self.dirs.append(d)
        (parents["cpu"] / name / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (parents["cpu"] / name / "cpu.cfs_quota_us").write_text(str(quota))
        (parents["memory"] / name / "memory.limit_in_bytes").write_text(str(memory_bytes))
        (parents["pids"] / name / "pids.max").write_text(str(tasks))
        self._usage = (parents["cpuacct"] / name / "cpuacct.usage", 1e9)

    def join_self(self) -> None:
        """Move the calling process into every group (call in the child, before exec)."""
        pid = str(os.getpid())
        for d in self.dirs:
            with open(d / "cgroup.procs", "w") as f:
                f.write(pid)

    def cpu_seconds(self) -> float:
        """CPU time used by everything in the sandbox so far (user + system)."""
        if self._usage is None:
            return 0.0
        path, divisor = self._usage
        try:
            text = path.read_text()
        except OSError:
            return 0.0
        if divisor:
            return int(text) / divisor
        fields = dict(line.split() for line in text.splitlines() if line)
        return int(fields.get("usage_usec", 0)) / 1e6

    def tasks(self) -> list[int]:
        pids: set[int] = set()
        for d in self.dirs:
            try:
                pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return sorted(pids)

    def close(self, wait: float = 5.0) -> None:
        """Kill whatever is left in the groups and remove them (no leftovers)."""
        deadline = time.monotonic() + wait
        while self.dirs:
            for pid in self.tasks():
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            for d in list(self.dirs):
                try:
                    d.rmdir()
                    self.dirs.remove(d)
                except FileNotFoundError:
                    self.dirs.remove(d)
                except OSError:
                    pass
            if self.dirs:
                if time.monotonic() > deadline:
                    raise OSError(f"cgroups still busy after {wait:.0f} s: {', '.join(map(str, self.dirs))}")
                time.sleep(0.02)
