"""The sandbox under attack: one class per attack family, graded in ONE `grade` call (b01,
`--jobs 2`) next to two honest classmates whose 12/12 must not move.

As in test_attacks, every attacker is otherwise the reference solution and its causal_mask is
correct only if the attack worked, so "12 minus test_masks' 2 points" means the attack failed
and 12 would mean it succeeded. The families (attack classes, not single tricks):

- host file system: reading anything outside the allow-list (repository, workspace, other
  sandboxes, host /tmp) and writing anywhere but the sandbox's own tmpfs;
- channels between submissions: files in /tmp, /var/tmp, /dev/shm and HOME, abstract unix
  sockets, loopback TCP, SysV shared memory, kernel keyrings;
- traps for the grader: links, FIFOs and very deep folders where a grader might open, write or
  clean up;
- privilege: nested user namespaces, mount, setuid, keyrings;
- quotas and fairness: filling the disk (bytes and inodes), forking hundreds of busy
  processes, eating memory — the attacker pays, the classmates graded beside it do not.

A checkout in a folder other users cannot traverse (0700) grades too (last test).
Needs root and bubblewrap; skipped elsewhere with that reason.
"""
import csv
import multiprocessing.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.reference import student_notebook, write_submission
from autograder.grading.grade import GradeOptions, grade
from autograder.isolation.sandbox import (
    Limits,
    course_paths,
    namespaces_available,
    sandbox_problem,
)
from autograder.isolation.uids import LOCK_DIR
from tests.support import failed_tests, saved_results

from .test_attacks import _cell, _wrong_unless

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not namespaces_available(), reason=f"bwrap sandbox unavailable: {sandbox_problem()}")]

ROOT = repo_root()
LAB = "b01"
HONEST = ("ada", "zoe")
DISK_MB, INODES, MEMORY_MB = 32, 3000, 2048

SENDER = '''
import ctypes, os, socket, subprocess
for folder in ("/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~")):
    open(os.path.join(folder, "camp-drop"), "w").write("hello")
_abstract = socket.socket(socket.AF_UNIX); _abstract.bind("\\0camp-drop"); _abstract.listen()
_tcp = socket.socket(); _tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
_tcp.bind(("127.0.0.1", 47123)); _tcp.listen()
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmget(0xCA3D, 4096, 0o1666)                          # IPC_CREAT | 0666
_libc.syscall(KEY_ADD, b"user", b"camp-drop", b"hello", 5, -4)   # add_key to the user keyring
'''

RECEIVER = '''
import ctypes, os, socket, time
def _channels():
    found = [f for f in ("/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~"))
             if os.path.exists(os.path.join(f, "camp-drop"))]
    for family, address in ((socket.AF_UNIX, "\\0camp-drop"), (socket.AF_INET, ("127.0.0.1", 47123))):
        try:
            socket.create_connection(address, 0.2) if family == socket.AF_INET else socket.socket(family).connect(address)
            found.append(str(address))
        except OSError:
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.shmget(0xCA3D, 0, 0) >= 0:
        found.append("sysv shm")
    if libc.syscall(KEY_CTL, 10, -4, b"user", b"camp-drop", 0) >= 0:   # KEYCTL_SEARCH in @u
        found.append("keyring")
    return found
_FOUND = []
for _ in range(16):                # the sender runs beside us (or ran before, with our uid)
    _FOUND += _channels()
    time.sleep(0.25)
'''

TRAPS = '''
import os
for name in ("output.log", "student.log", "sandbox.log", "in", "student"):
    for folder in (".", "/tmp", "/dev/shm"):
        path = os.path.join(folder, name)
        try:
            os.symlink(GRADEBOOK, path)
        except OSError:
            pass
        try:
            os.mkfifo(path + ".fifo")
        except OSError:
            pass
os.symlink(".", "loop")
deep = "d"
os.makedirs("deep", exist_ok=True)
os.chdir("deep")
for _ in range(400):               # ~400 levels (well past any recursion limit of a clean-up)
    os.mkdir(deep)
    os.chdir(deep)
os.chdir(os.path.expanduser("~"))
'''

FILL = '''
import os
_FOLDERS = (".", "/tmp", "/var/tmp", "/dev/shm")
def _fill(i, folder):
    n, chunk = 0, b"x" * 2**20
    try:
        with open(os.path.join(folder, f"fill-{i}"), "wb") as f:
            while n < 4 * DISK:
                f.write(chunk); f.flush(); n += len(chunk)
    except OSError:
        pass
    return n
def _files(folder):
    os.makedirs(folder, exist_ok=True)
    for i in range(4 * INODES):
        try:
            open(os.path.join(folder, str(i)), "w").close()
        except OSError:
            return i
    return 4 * INODES
_WRITTEN = sum(_fill(i, f) for i, f in enumerate(_FOLDERS))
_MADE = _files("many")
for i, f in enumerate(_FOLDERS):
    os.remove(os.path.join(f, f"fill-{i}"))
import shutil; shutil.rmtree("many")
'''

FORK_STORM = '''
import os, select, threading, time
_FORKED = 0
_r, _w = os.pipe()
_give_up = time.time() + 20
def _reap():                       # zombies would count against the task limit after the storm
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            if _w is None:
                return
            time.sleep(0.1)
threading.Thread(target=_reap, daemon=True).start()
for _ in range(400):               # every child stays alive and busy until the storm is over, so
    try:                           # _FORKED counts processes alive AT ONCE (forks of a big process
        pid = os.fork()            # are slow: children that had already left would free slots)
    except OSError:
        break
    if pid == 0:
        os.close(_w)
        while not select.select([_r], [], [], 0)[0] and time.time() < _give_up:
            pass
        os._exit(0)
    _FORKED += 1
os.close(_w)                       # end of the storm: every child sees EOF and leaves
_w = None
'''

MEMORY_EATER = '''
import os, time
_eaters = []
for _ in range(3):                 # forked (the sandbox starts no new program): 900 MiB each
    pid = os.fork()
    if pid == 0:
        try:
            x = b"1" * (900 << 20)
            time.sleep(3)
            os._exit(0)
        except BaseException:
            os._exit(1)
    _eaters.append(pid)
_SURVIVED = sum(os.waitpid(p, 0)[1] == 0 for p in _eaters)
'''


def _attacks(out: Path, subs: Path, scratch: Path) -> dict:
    host = [ROOT / "solutions", ROOT / "tests", ROOT / ".git", ROOT / "runs", ROOT / "course", ROOT / "labs",
            ROOT / "pyproject.toml", out, subs, scratch, Path.home() / ".bash_history", Path("/etc/shadow"),
            Path(LOCK_DIR)]
    targets = [str(p) for p in course_paths()] + ["/", "/etc", "/usr/lib", str(ROOT)]
    key_add = 248 if os.uname().machine == "x86_64" else 217
    key_ctl = 250 if os.uname().machine == "x86_64" else 219
    channel_numbers = f"KEY_ADD, KEY_CTL = {key_add}, {key_ctl}\n"
    gradebook = f"GRADEBOOK = {str(out / 'gradebook.db')!r}\n"
    return {
        # host file system
        "fs_read": student_notebook(LAB, {"masks": _wrong_unless(
            f"any(os.path.exists(p) for p in {[str(p) for p in host]!r}) or "
            "any(n.startswith('camp-') or n.startswith('pytest') for n in os.listdir('/tmp'))")}),
        "fs_write": student_notebook(LAB, {"masks": _wrong_unless(
            f"any(os.access(p, os.W_OK) or not os.system(f'touch {{p}}/camp-x 2>/dev/null') for p in {targets!r})")}),
        # channels between submissions (sender first, receiver next to it or after it)
        "chan_1_sender": _cell(student_notebook(LAB), "softmax", channel_numbers + SENDER),
        "chan_2_receiver": _cell(student_notebook(LAB, {"masks": _wrong_unless("_FOUND")}), "softmax",
                                 channel_numbers + RECEIVER),
        # traps for the grader
        "grader_traps": _cell(student_notebook(LAB), "softmax", gradebook + TRAPS),
        # privilege
        "privilege": student_notebook(LAB, {"masks": _wrong_unless(
            "(lambda libc: libc.unshare(0x10000000) == 0 or libc.setuid(0) == 0 or "
            "libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0 or libc.syscall("
            f"{key_add}, b'user', b'k', b'v', 1, -4) >= 0 or os.access('/proc/1/environ', os.R_OK))"
            "(__import__('ctypes').CDLL(None))")}),
        # quotas and fairness
        "disk_filler": _cell(student_notebook(LAB, {"masks": _wrong_unless(
            f"_WRITTEN > {DISK_MB} * 2**20 or _MADE >= {INODES}")}), "softmax",
            f"DISK, INODES = {DISK_MB} * 2**20, {INODES}\n" + FILL),
        "fork_storm": _cell(student_notebook(LAB, {"masks": _wrong_unless("_FORKED >= 400")}), "softmax", FORK_STORM),
        "memory_eater": _cell(student_notebook(LAB, {"masks": _wrong_unless("_SURVIVED == 3")}), "softmax",
                              MEMORY_EATER),
        **{name: student_notebook(LAB) for name in HONEST},
    }


def _camp_cgroups() -> set[Path]:
    return {p for p in Path("/sys/fs/cgroup").rglob("camp-*") if p.is_dir()}


@pytest.fixture(scope="module")
def cgroups_before() -> set[Path]:
    """The sandbox groups on this machine before this module grades (another grader's, live or
    killed: the grader sweeps a dead owner's groups, but a reused pid can make one look alive)."""
    return _camp_cgroups()


@pytest.fixture(scope="module")
def graded(tmp_path_factory, cgroups_before):
    tmp = tmp_path_factory.mktemp("isolation_attacks")
    subs, out, scratch = tmp / "submissions", tmp / "workspace", tmp / "scratch"
    scratch.mkdir(mode=0o700)
    for student, nb in _attacks(out, subs, scratch).items():
        write_submission(subs, student, LAB, nb)
    options = GradeOptions(jobs=2, cell_timeout=20,
                           limits=Limits(disk_mb=DISK_MB, disk_inodes=INODES, memory_mb=MEMORY_MB))
    # multiprocessing's own folder for this test process (the grading fork server's socket lives there as
    # long as the process) is made before the scratch is set: where this module graded first in its xdist
    # worker, the fork server started now and its pymp-* folder stayed in the scratch (not the grader's)
    multiprocessing.util.get_temp_dir()
    saved, tempfile.tempdir = tempfile.tempdir, str(scratch)   # the grader's own scratch goes here
    try:
        rows = grade(subs, Catalog.load(), ROOT, out, None, options)
    finally:
        tempfile.tempdir = saved
    results = {r.student: r for r in rows}
    details = saved_results(out, "b01_attention")
    return out, results, details, scratch


def _attackfailed_tests(rows, details, student):
    """The attacker lost exactly test_masks (2 points): the attack did not work, and nothing
    else about its grading changed."""
    assert (failed_tests(details, student), rows[student].score) == (["test_masks"], 10), details[student]


def test_honest_classmates_score_as_if_alone(graded):
    _, rows, details, _ = graded
    for student in HONEST:
        assert (rows[student].score, rows[student].status) == (12, "graded"), details[student]


class TestHostFileSystem:
    def test_nothing_outside_the_allow_list_is_readable(self, graded):
        _, rows, details, _ = graded
        _attackfailed_tests(rows, details, "fs_read")

    def test_nothing_outside_the_sandbox_tmpfs_is_writable(self, graded):
        _, rows, details, _ = graded
        _attackfailed_tests(rows, details, "fs_write")
        assert not any((p / "camp-x").exists() for p in [*course_paths(), ROOT, Path("/etc"), Path("/usr/lib")])


class TestChannelsBetweenSubmissions:
    def test_nothing_passes_from_one_submission_to_another(self, graded):
        _, rows, details, _ = graded
        assert rows["chan_1_sender"].score == 12, details["chan_1_sender"]
        _attackfailed_tests(rows, details, "chan_2_receiver")


class TestTrapsForTheGrader:
    def test_links_fifos_and_deep_folders_change_nothing_and_leave_nothing(self, graded):
        out, rows, details, scratch = graded
        assert rows["grader_traps"].score == 12, details["grader_traps"]
        with open(out / "grades.csv") as f:
            sheet = {r["student"]: float(r["score"]) for r in csv.DictReader(f)}
        assert sheet["ada"] == 12 and sheet["zoe"] == 12
        assert os.listdir(scratch) == [], "the grader's scratch was not cleaned up"


class TestPrivilege:
    def test_no_user_namespace_mount_setuid_or_keyring(self, graded):
        _, rows, details, _ = graded
        _attackfailed_tests(rows, details, "privilege")


class TestQuotasAndFairness:
    def test_disk_bytes_and_inodes_are_capped(self, graded):
        _, rows, details, _ = graded
        _attackfailed_tests(rows, details, "disk_filler")

    def test_a_fork_storm_is_capped_and_costs_only_its_author(self, graded):
        _, rows, details, _ = graded
        _attackfailed_tests(rows, details, "fork_storm")

    def test_a_memory_eater_is_capped_and_costs_only_its_author(self, graded):
        _, rows, details, _ = graded
        _attackfailed_tests(rows, details, "memory_eater")

    def test_no_cgroup_is_left_behind(self, graded, cgroups_before):
        groups = _camp_cgroups() - cgroups_before   # this grading's (a killed grader's are not its)
        # camp-<uid>-<worker pid>-<n>: a group whose worker is gone is a leftover (other graders
        # on this machine may hold live ones)
        left = [p for p in groups if not _pid_alive(int(p.name.split("-")[2]))]
        assert left == [], left


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_checkout_in_a_private_folder_grades(tmp_path):
    """The course copied into a 0700 folder (as `mktemp -d` makes) grades a reference
    submission: the sandbox binds the code past the private folder (the Python environment
    of this machine already lives under a 0700 /root)."""
    private = Path(tempfile.mkdtemp(prefix="camp-private-", dir=tmp_path))
    assert os.stat(private).st_mode & 0o777 == 0o700
    for name in ("camplib", "autograder", "course", "solutions", "labs"):
        shutil.copytree(ROOT / name, private / name, ignore=shutil.ignore_patterns("__pycache__"))
    (private / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    subs = tmp_path / "subs"
    write_submission(subs, "ada", LAB, student_notebook(LAB))
    env = {**os.environ, "PYTHONPATH": str(private), "CAMP_ROOT": str(private)}
    probe = subprocess.run([sys.executable, "-c", "import autograder, camplib; print(autograder.__file__, camplib.__file__)"],
                           env=env, cwd=private, capture_output=True, text=True, check=True)
    assert probe.stdout.split() == [str(private / "autograder" / "__init__.py"), str(private / "camplib" / "__init__.py")]
    done = subprocess.run([sys.executable, "-m", "autograder.cli", "grade", str(subs), "--out", str(tmp_path / "ws"),
                           "--lab", LAB], env=env, cwd=private, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "ws" / "grades.csv") as f:
        assert [(r["student"], float(r["score"]), r["status"]) for r in csv.DictReader(f)] == [("ada", 12.0, "graded")]


def test_a_timeout_short_of_cpu_is_graded_again_alone(tmp_path, monkeypatch):
    """`--jobs 2`: a submission whose timeout came while its sandbox got little CPU (the flag
    `Sandbox.starved`) is not published; it is graded again alone (one job in the pool, the other workers idle), and that result
    counts. The pool is faked: this checks the scheduling, the sandbox's flag is tested in
    tests/autograder/isolation/test_confinement.py."""
    import autograder.grading.grade as grade_module
    from autograder.course.labspec import LabSpec
    from autograder.grading.results import SubmissionResult, TestOutcome

    calls = []

    class CrowdedPool:
        """The first batch runs two at a time (crowded is starved); later batches run alone."""

        def __init__(self, n, isolation, threads, warm):
            assert n == 2

        def run(self, jobs):
            calls.append(sorted(j["student"] for j in jobs))
            alone = len(calls) > 1
            for job in jobs:
                spec = LabSpec.from_notebook(Path(job["source"]))
                tests = [TestOutcome(t.grade_id, t.points, t.points if alone else 0.0, "" if alone else "timed out")
                         for t in spec.tests]
                result = SubmissionResult(job["student"], job["lab"], "graded", sum(t.score for t in tests),
                                          spec.max_score, tests)
                yield job, result, not alone and job["student"] == "crowded"

        def close(self):
            pass

    monkeypatch.setattr(grade_module, "GradingPool", CrowdedPool)
    subs = tmp_path / "subs"
    for student in ("ada", "crowded"):
        write_submission(subs, student, LAB, student_notebook(LAB))
    rows = grade(subs, Catalog.load(), ROOT, tmp_path / "ws", None, GradeOptions(jobs=2))
    assert calls == [["ada", "crowded"], ["crowded"]]
    assert {r.student: r.score for r in rows} == {"ada": 0.0, "crowded": 12.0}
