"""What a sandbox's process sees and may do, asked from inside one bwrap sandbox: its uid and
capabilities, the file system (read-only except one limited tmpfs), namespaces, the system-call
filter and its cgroup. Needs root and bubblewrap; skipped elsewhere with that reason."""
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder.grading.remote import Session
from autograder.isolation import cgroups, seccomp
from autograder.isolation.sandbox import (
    WORK,
    Limits,
    Sandbox,
    StudentTimedOut,
    course_paths,
    namespaces_available,
    sandbox_problem,
)
from autograder.isolation.uids import FIRST_UID as BASE_UID

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not namespaces_available(), reason=f"bwrap sandbox unavailable: {sandbox_problem()}")

ADD_KEY = seccomp._ARCHES[platform.machine()][1]["add_key"] if seccomp.supported() else 0
PROBE = r'''
import ctypes, errno, os, socket, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def call(fn, *args):
    r = fn(*args)
    return 0 if r == 0 else ctypes.get_errno()
def fill(folder, chunk=2**20):
    n = 0
    try:
        with open(os.path.join(folder, "fill"), "wb") as f:
            while n < 10 * 2**30:
                f.write(b"x" * chunk); f.flush(); n += chunk
    except OSError as exc:
        return n, exc.errno
    return n, 0
def make_files(folder, count):
    os.makedirs(folder, exist_ok=True)
    for i in range(count):
        try:
            open(os.path.join(folder, str(i)), "w").close()
        except OSError as exc:
            return i, exc.errno
    return count, 0
def exec_errno():
    """errno of starting /bin/true, here and in a forked child (0: it started)."""
    import subprocess
    try:
        subprocess.run(["/bin/true"], check=True)
        here = 0
    except OSError as exc:
        here = exc.errno
    pid = os.fork()
    if pid == 0:
        try:
            os.execv("/bin/true", ["true"])
        except OSError as exc:
            os._exit(100 + exc.errno)
    return [here, os.waitpid(pid, 0)[1] >> 8]

def writable(path):
    try:
        with open(os.path.join(path, ".probe"), "w"):
            pass
        return True
    except OSError:
        return False
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
probe = {
    "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getgroups()],
    "caps": [status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")],
    "no_new_privs": status["NoNewPrivs"].strip(),
    "cwd": os.getcwd(),
    "helper": open("helper.py").read(),
    "root": sorted(os.listdir("/")),
    "userns": call(libc.unshare, 0x10000000),
    "mount": call(libc.mount, b"none", b"/tmp", b"tmpfs", 0, None),
    "keyctl": [libc.syscall(ADD_KEY, b"user", b"k", b"v", 1, -4), ctypes.get_errno()],
    "setuid0": call(libc.setuid, 0),
    "interfaces": sorted(i[1] for i in socket.if_nameindex()),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "writable": {p: writable(p) for p in ["/", "/etc", "/usr", "/run", "/home", *COURSE]},
    "threads": os.environ.get("OMP_NUM_THREADS"),
    "exec": exec_errno(),
}
probe["work_fill"] = fill(".")
os.remove("fill")
probe["shm_fill"] = fill("/dev/shm")
os.remove("/dev/shm/fill")
probe["inodes"] = make_files("/tmp/many", 5000)
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    staging = tmp_path_factory.mktemp("confinement") / "in"
    staging.mkdir()
    (staging / "helper.py").write_text("HELPER = 1\n")
    limits = Limits(disk_mb=16, disk_inodes=1000, cpus=0.5, memory_mb=2048)
    sandbox = Sandbox(staging, isolation="bwrap", limits=limits, threads=1)
    sandbox.start()
    try:
        session = Session(sandbox)
        error = session.request("exec", "probe", source=f"COURSE = {[str(p) for p in course_paths()]!r}\nADD_KEY = {ADD_KEY}\n" + PROBE)
        assert error is None, error
        found = session.request("getattr", "probe", target="probe", name="copy")()
        groups = list(sandbox.budget.dirs) if sandbox.budget else []
        quota = [(d / "cpu.cfs_quota_us").read_text().strip() for d in groups if (d / "cpu.cfs_quota_us").exists()]
    finally:
        sandbox.close()
    return dict(found, leased_uid=sandbox.uid), groups, quota


def test_runs_as_the_leased_uid_with_no_privilege(probe):
    found, _, _ = probe
    uid = found["leased_uid"]
    assert uid >= BASE_UID and found["ids"] == [uid, uid, uid, []]
    assert found["caps"] == ["0000000000000000"] * 4 and found["no_new_privs"] == "1"
    assert found["setuid0"] == 1          # EPERM


def test_no_nested_user_namespace_no_mount_no_keyring(probe):
    found, _, _ = probe
    assert found["userns"] == 1 and found["mount"] == 1          # EPERM from the filter / no capability
    assert found["keyctl"] == [-1, 1]                             # add_key: EPERM


def test_no_new_program_starts_not_even_in_a_forked_child(probe):
    """The student's process refuses execve (autograder.isolation.seccomp): no interpreter can
    start without the grader's observer."""
    found, _, _ = probe
    assert found["exec"] == [1, 101]                              # EPERM, in the child too


def test_sees_only_the_system_the_environment_and_the_course_code(probe):
    found, _, _ = probe
    assert set(found["root"]) <= {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc",
                                  "tmp", "var", "run", "home", *(p.parts[1] for p in course_paths())}, found["root"]
    assert found["cwd"] == WORK and found["helper"] == "HELPER = 1\n"
    assert found["interfaces"] == ["lo"]
    assert len(found["pids"]) <= 4, found["pids"]     # bwrap's reaper, the runner, the probe's children


def test_only_the_limited_tmpfs_is_writable(probe):
    found, _, _ = probe
    assert not any(found["writable"].values()), found["writable"]
    limit = 16 * 2**20
    for key in ("work_fill", "shm_fill"):
        written, err = found[key]
        assert err == 28 and written <= limit, (key, written, err)   # ENOSPC at the quota
    made, err = found["inodes"]
    assert err == 28 and made < 1000, (made, err)


def test_threads_and_cgroup_budget(probe):
    found, groups, quota = probe
    assert found["threads"] == "1"
    if cgroups.problem() is None:
        assert groups and quota in ([], ["50000"]), quota
        assert not any(d.exists() for d in groups), "cgroups left behind"


def test_a_checkout_other_users_cannot_read_is_refused_by_name(tmp_path):
    from autograder.isolation.sandbox import unreadable_course_file
    pkg = tmp_path / "course" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "ok.py").write_text("")
    secret = pkg / "private.py"
    secret.write_text("")
    secret.chmod(0o600)
    tmp_path.chmod(0o700)                            # a private parent does not matter
    assert unreadable_course_file([tmp_path / "course"]) == secret
    secret.chmod(0o644)
    assert unreadable_course_file([tmp_path / "course"]) is None
    (pkg / "__pycache__").mkdir(mode=0o700)          # Python's cache under `umask 077`: compiled
    assert unreadable_course_file([tmp_path / "course"]) is None   # from source where unreadable
    pkg.chmod(0o700)                                 # what `umask 077` makes
    assert unreadable_course_file([tmp_path / "course"]) == pkg


# The grader of a checkout elsewhere: a sandbox whose student imports the course from it.
PRIVATE_CHECKOUT = """
import sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from autograder.grading.remote import RemoteObject, Session
from autograder.isolation.sandbox import Sandbox, course_paths, unreadable_course_file
assert unreadable_course_file(course_paths()) is None, unreadable_course_file(course_paths())
sandbox = Sandbox(Path(tempfile.mkdtemp()) / "in", isolation="bwrap")
sandbox.start()
try:
    session = Session(sandbox)
    assert session.request("exec", "cell", source="import camplib.attention, autograder.checks\\n"
                           "def where():\\n    return [camplib.attention.__file__, autograder.checks.__file__]\\n") is None
    print(*RemoteObject(session, "where", "where")())
finally:
    sandbox.close()
"""


@pytest.mark.slow
def test_a_checkout_in_a_private_folder_under_tmp_grades_under_umask_077():
    """`make test` from a clone in a `mktemp -d` folder (0700, under /tmp, the clone 0700 too),
    run by an instructor whose umask is 077 (the clone's files made readable, as camp grade asks):
    the sandbox binds past the private folders, and under /tmp, which is the student's tmpfs
    there, the folders it makes on the way back to the checkout are open to the student's uid.
    Under umask 077 they were 0700: 'No module named autograder' in the sandbox."""
    parent = Path(tempfile.mkdtemp(prefix="camp-private-", dir="/tmp"))   # mktemp -d: 0700
    try:
        clone = parent / "clone"
        clone.mkdir(mode=0o700)
        for package in ("camplib", "autograder"):
            shutil.copytree(ROOT / package, clone / package, ignore=shutil.ignore_patterns("__pycache__"))
        out = subprocess.run([sys.executable, "-I", "-c", PRIVATE_CHECKOUT, str(clone)], capture_output=True, text=True,
                             timeout=300, cwd=clone, preexec_fn=lambda: os.umask(0o077))
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split() == [str(clone / "camplib" / "attention.py"), str(clone / "autograder" / "checks.py")]
    finally:
        shutil.rmtree(parent)


def test_uids_are_leased_exclusively_across_processes(tmp_path):
    from autograder.isolation.uids import UidLease
    lock_dir = tmp_path / "locks"
    mine = UidLease(lock_dir, first=62000, count=3)
    code = ("import sys; from pathlib import Path; from autograder.isolation.uids import UidLease; "
            f"print(UidLease(Path({str(lock_dir)!r}), first=62000, count=3).uid)")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(other.stdout) == mine.uid + 1          # the held uid is skipped
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(again.stdout) == mine.uid + 1          # the other process died: its uid is free again
    mine.release()
    assert UidLease(lock_dir, first=62000, count=3).uid == mine.uid
    os.chmod(lock_dir, 0o755)                         # a lock folder others could write into is refused
    with pytest.raises(RuntimeError, match="mode 0700"):
        UidLease(lock_dir, first=62000, count=3)


def test_a_timeout_says_whether_the_sandbox_was_starved(tmp_path):
    """A sleeping (or crowded-out) request got little CPU before its deadline: the sandbox flags
    it, and `camp grade --jobs N` grades such a submission again alone. A busy loop's CPU is
    counted by its cgroup."""
    if cgroups.problem() is not None:
        pytest.skip(f"no cgroups: {cgroups.problem()}")
    staging = tmp_path / "in"
    staging.mkdir()
    sandbox = Sandbox(staging, isolation="bwrap", limits=Limits(cpus=1.0))
    try:
        sandbox.start()
        before = sandbox.cpu_seconds()
        with pytest.raises(StudentTimedOut):
            sandbox.request({"op": "exec", "source": "import time\nwhile True: time.sleep(1)"}, timeout=1.5)
        assert sandbox.starved
        sandbox.starved = False
        sandbox.start()
        before = sandbox.cpu_seconds()
        sandbox.request({"op": "exec", "source": "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"},
                        timeout=60)
        assert sandbox.cpu_seconds() - before >= 0.3 and not sandbox.starved
    finally:
        sandbox.close()


def test_groups_of_a_grader_that_died_are_swept():
    if cgroups.problem() is not None:
        pytest.skip(f"no cgroups: {cgroups.problem()}")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    live = cgroups.Budget(BASE_UID, 1, cpus=1.0, memory_bytes=2**30, tasks=16)
    try:
        orphan_dirs = [d.with_name(d.name.replace(f"-{os.getpid()}-", f"-{int(dead.stdout)}-")) for d in live.dirs]
        for d in orphan_dirs:
            d.mkdir()
        cgroups.sweep_orphans()
        assert not any(d.exists() for d in orphan_dirs) and all(d.exists() for d in live.dirs)
    finally:
        live.close()
    assert not any(d.exists() for d in live.dirs)
