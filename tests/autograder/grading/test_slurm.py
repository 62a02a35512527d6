"""`camp grade --on slurm` through a real one-node Slurm: the same class graded locally and as a
job array gives the same grades, test by test and reason by reason, while the run is disturbed
the way a cluster disturbs it: one task is preempted (requeued by Slurm) after its first student,
another is killed (SIGKILL, as a crashed node) after its first student. Neither finished student is graded twice (their
result files stay byte for byte as first written: a regrade would record other timings), and
the killed task's unfinished student goes into a second array. A hostile submission tries to
forge a classmate's result in the shared workspace and crashes its own process.

Needs root, bubblewrap (the sandbox) and Debian's slurm-wlm and munge (tests/.../slurm_cluster)."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.reference import student_notebook, write_submission
from autograder.grading.grade import GradeOptions, grade
from autograder.grading.slurm import SlurmOptions, split_shards
from autograder.isolation.sandbox import namespaces_available
from tests.autograder.grading.slurm_cluster import start_slurm
from tests.autograder.grading.test_attacks import _cell, _wrong_unless
from tests.autograder.grading.test_grade import UNSTABLE_SOFTMAX
from tests.support import saved_results

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not namespaces_available(), reason="the bwrap sandbox needs root and bubblewrap")]

ROOT = repo_root()
LAB, LAB_NAME = "b01", "b01_attention"
SEED = 20261204


# Each shard's second student (blank, mallory) first sleeps this long, so that the disturbance, sent
# when the shard's first result appears, lands while its task is still grading: a task that had
# already finished made the requeue and the kill no-ops (the requeued task was cancelled by the
# finished run before it started again; the killed one had delivered everything), a flake seen in
# full runs under load. Longer than the cluster's KillWait (5 s, course/slurm/slurm.conf.in): the
# requeued task ignores SIGTERM (submitit) and is killed then.
SECOND_STUDENT_SECONDS = 10


def _slow(nb):
    nb.cells.insert(0, nbformat.v4.new_code_cell(f"import time\ntime.sleep({SECOND_STUDENT_SECONDS})"))
    return nb


def _class(subs, target):
    """ada: the reference; blank: nothing written; carl: one wrong function; mallory: hostile,
    correct masks only if she could overwrite ada's result in `target`'s shared workspace, then
    her process exits in the middle of the notebook. blank and mallory start slowly (_slow)."""
    forge = f"open({str(target / 'results' / LAB_NAME / 'ada.json')!r}, 'w').write('{{}}') or True"
    write_submission(subs, "ada", LAB, student_notebook(LAB))
    write_submission(subs, "blank", LAB, _slow(student_notebook(LAB, solve=False)))
    write_submission(subs, "carl", LAB, student_notebook(LAB, {"softmax": UNSTABLE_SOFTMAX}))
    write_submission(subs, "mallory", LAB, _slow(_cell(student_notebook(LAB, {"masks": _wrong_unless(forge)}),
                                                       "masks", "import os\nos._exit(3)")))


class Disturber(threading.Thread):
    """Once each task of the first array has saved its first result: requeue task 0 (what
    Slurm does to a preempted task) and SIGKILL every process of task 1. Records what each first result held."""

    def __init__(self, out):
        super().__init__(daemon=True)
        self.out, self.first, self.done, self.stop = out, {}, {}, False

    def run(self):
        results = self.out / "results" / LAB_NAME
        while not self.stop and len(self.done) < 2:
            arrays = sorted(self.out.glob("slurm/*_0"))
            shards = {"ada": 0, "blank": 0, "carl": 1, "mallory": 1}   # split_shards of the four, checked below
            for path in sorted(results.glob("*.json")) if arrays else ():
                task = shards[path.stem]
                if task in self.done:
                    continue
                self.first[path.stem] = path.read_bytes()
                job = f"{arrays[0].name.split('_')[0]}_{task}"
                cmd = ["scontrol", "requeue", job] if task == 0 else ["scancel", "--signal=KILL", "--full", job]
                p = subprocess.run(cmd, capture_output=True, text=True)
                self.done[task] = (" ".join(cmd), p.returncode, p.stderr.strip())
            time.sleep(0.2)


@contextlib.contextmanager
def slurm_conf(conf):
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    conf = start_slurm()
    tmp = tmp_path_factory.mktemp("slurm")
    here, there = tmp / "local", tmp / "slurm"
    _class(tmp / "subs", there)
    catalog = Catalog.load()
    started = time.monotonic()
    local = {r.student: r for r in grade(tmp / "subs", catalog, ROOT, here, LAB,
                                         GradeOptions(jobs=2, seed=SEED, cell_timeout=30))}
    local_s = time.monotonic() - started
    disturber = Disturber(there)
    disturber.start()
    started = time.monotonic()
    try:
        with slurm_conf(conf):
            sharded = {r.student: r for r in grade(
                tmp / "subs", catalog, ROOT, there, LAB,
                GradeOptions(jobs=2, seed=SEED, cell_timeout=30, on="slurm",
                             slurm=SlurmOptions(shards=2, minutes=10, mem_gb=2, grace_seconds=2, poll_seconds=0.5)))}
    finally:
        disturber.stop = True
        disturber.join()
    print(f"local {local_s:.0f} s, slurm (disturbed) {time.monotonic() - started:.0f} s")
    return here, there, local, sharded, disturber, conf, tmp / "subs"


def _tests(workspace):
    return {student: [(t["grade_id"], t["points"], t["score"], t["message"]) for t in r["tests"]]
            for student, r in saved_results(workspace, LAB_NAME).items()}


def test_sharding_is_what_the_disturber_assumes():
    jobs = [{"lab": LAB, "student": s} for s in ("mallory", "carl", "ada", "blank")]
    assert [[j["student"] for j in shard] for shard in split_shards(jobs, 2)] == [["ada", "blank"], ["carl", "mallory"]]


def _tasks(there):
    """Slurm ids of the tasks that ran ("17_0" in an array, "19" alone), from submitit's logs."""
    return sorted(p.name[:-len("_0_log.out")] for p in (there / "slurm").glob("*/*_0_log.out"))


def test_the_run_was_preempted_and_a_task_killed(graded):
    _, there, _, _, disturber, *_ = graded
    assert sorted(disturber.done) == [0, 1], disturber.done
    assert all(rc == 0 for _, rc, _ in disturber.done.values()), disturber.done
    tasks = _tasks(there)
    arrays = sorted({t.split("_")[0] for t in tasks}, key=int)
    assert len(arrays) == 2, f"the killed task's unfinished student should go into a second submission: {tasks}"
    assert [t for t in tasks if t.split("_")[0] == arrays[1]] == [arrays[1]], "one task for one student"
    starts = (there / "slurm" / f"{arrays[0]}_0" / f"{arrays[0]}_0_0_log.out").read_text().count("Starting with")
    assert starts == 2, "the preempted task should have run again after its requeue"


def test_slurm_grades_equal_local_grades_test_by_test(graded):
    here, there, local, sharded, *_ = graded
    assert _tests(there) == _tests(here)
    assert set(_tests(there)) == {"ada", "blank", "carl", "mallory"}
    for student, row in local.items():
        other = sharded[student]
        assert (other.score, other.max_score, other.status, other.message) == \
               (row.score, row.max_score, row.status, row.message), student
    assert local["ada"].score == 12 and local["carl"].score < 12 and local["blank"].score == 0
    assert local["mallory"].score == 10   # her forgery failed: the masks test is lost, the rest stands


def test_finished_students_are_not_graded_again(graded):
    _, there, _, _, disturber, *_ = graded
    assert len(disturber.first) == 2
    for student, first in disturber.first.items():
        assert (there / "results" / LAB_NAME / f"{student}.json").read_bytes() == first, student
        assert json.loads(first)["result"]["status"] == "graded"


def test_one_gradebook_grade_sheet_and_report(graded):
    _, there, _, sharded, *_ = graded
    sheet = (there / "grades.csv").read_text()
    for student, row in sharded.items():
        assert f"{student},{LAB}," in sheet
    assert "mallory" in (there / "report.html").read_text()
    from autograder.reports.gradebook import scores
    for student, row in sharded.items():
        assert scores(there / "gradebook.db", LAB_NAME, student) == (row.score, row.max_score), student


def test_a_second_run_resumes_without_submitting_anything(graded):
    _, there, _, sharded, _, conf, subs = graded
    before = sorted(p.name for p in (there / "slurm").iterdir())
    with slurm_conf(conf):
        again = {r.student: r for r in grade(subs, Catalog.load(), ROOT, there, LAB,
                                             GradeOptions(jobs=2, seed=SEED + 1, on="slurm",
                                                          slurm=SlurmOptions(mem_gb=2)))}
    assert sorted(p.name for p in (there / "slurm").iterdir()) == before
    assert {s: r.score for s, r in again.items()} == {s: r.score for s, r in sharded.items()}


def test_an_interrupted_run_cancels_its_tasks(tmp_path):
    """Ctrl-C on `camp grade --on slurm` leaves no task of its array pending or running."""
    conf = start_slurm()
    write_submission(tmp_path / "subs", "ada", LAB, student_notebook(LAB))
    out = tmp_path / "ws"
    p = subprocess.Popen([sys.executable, "-m", "autograder.cli", "grade", str(tmp_path / "subs"), "--out", str(out),
                          "--lab", LAB, "--on", "slurm", "--task-mem-gb", "2"],
                         env={**os.environ, "SLURM_CONF": conf}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         # Ctrl-C as a terminal delivers it: where this test runs in a background job (`cmd &`
                         # in a script), SIGINT is ignored there and the CLI would inherit that and finish (rc 0)
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 180
    while not list(out.glob("slurm/*/*_submitted.pkl")) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
    submitted = list(out.glob("slurm/*/*_submitted.pkl"))
    p.send_signal(signal.SIGINT)
    log = p.communicate(timeout=120)[0]
    assert submitted, f"nothing was submitted: {log[-2000:]}"
    job = submitted[0].parent.name.split("_")[0]
    with slurm_conf(conf):
        left = subprocess.run(["squeue", "-h", "-r", "-j", job, "-t", "PD,R", "-o", "%i"], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"tasks of job {job} still queued after Ctrl-C: {left.stdout}"
    assert p.returncode != 0
