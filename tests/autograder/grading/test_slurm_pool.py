"""SlurmPool's bookkeeping without a cluster (fast, everywhere): which students a task delivered,
which it saved before it died, which go into the next array and when one is given up. Slurm
itself is replaced by tasks that end as told; the real cluster is tests/.../test_slurm.py."""
import pickle

import pytest

from autograder.catalog import Catalog, repo_root
from autograder.grading import slurm
from autograder.grading.results import SubmissionResult, save_result
from autograder.grading.results import TestOutcome as Outcome

ROOT = repo_root()
LAB = Catalog.load().get("b01")


class FakeTask:
    """A finished task: with a result pickle (what grade_shard returned) or gone without one."""

    def __init__(self, folder, job_id, delivered):
        self.job_id, self.delivered = job_id, delivered
        self.paths = type("P", (), {"result_pickle": folder / f"{job_id}.pkl", "stderr": folder / f"{job_id}.err"})()
        if delivered is not None:
            self.paths.result_pickle.write_bytes(pickle.dumps(delivered))

    def result(self):
        return self.delivered


def _job(student):
    return {"student": student, "lab": LAB.id, "lab_name": LAB.name, "key": f"key-{student}",
            "source": str(LAB.source_path(ROOT))}


def _result(student, score=12.0):
    return SubmissionResult(student, LAB.id, "graded", score=score, max_score=12.0,
                            tests=[Outcome("test_softmax", 2, 2)])


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """A SlurmPool whose `behave(shard)` says what each submitted task does."""
    monkeypatch.setattr(slurm, "slurm_problem", lambda: None)
    monkeypatch.setattr(slurm, "_queued_tasks", lambda array_id, states=None: set())   # every task has ended
    p = slurm.SlurmPool(tmp_path, slots=2, options=slurm.SlurmOptions(grace_seconds=0, poll_seconds=0), memory_mb=1024)
    p.submitted = []

    def submit(shards, slots):
        tasks = []
        for i, shard in enumerate(shards):
            n = len(p.submitted)
            p.submitted.append([j["student"] for j in shard])
            tasks.append(FakeTask(tmp_path, f"{n}_{i}", p.behave(shard, n)))
        return tasks

    monkeypatch.setattr(p, "_submit", submit)
    return p


def test_a_dead_tasks_saved_students_count_and_the_rest_are_submitted_again(pool, tmp_path):
    def behave(shard, n):
        if n == 0 and shard[0]["student"] == "ada":   # dies after saving ada, before returning
            save_result(tmp_path, LAB.name, _result("ada", 11.0), "key-ada")
            return None
        return [{"student": j["student"], "lab": j["lab"], "result": _result(j["student"]).to_dict(), "starved": False}
                for j in shard]
    pool.behave = behave
    got = {job["student"]: result for job, result, _ in pool.run([_job(s) for s in ("dan", "ada", "bob", "cy")])}
    assert pool.submitted == [["ada", "bob"], ["cy", "dan"], ["bob"]]
    assert got["ada"].score == 11.0 and not got["ada"].retry      # read from its file, not graded again
    assert all(got[s].score == 12.0 and not got[s].retry for s in ("bob", "cy", "dan"))


def test_a_student_whose_tasks_keep_failing_is_a_grader_error_after_the_attempts(pool):
    pool.behave = lambda shard, n: None if any(j["student"] == "eve" for j in shard) else \
        [{"student": j["student"], "lab": j["lab"], "result": _result(j["student"]).to_dict(), "starved": False}
         for j in shard]
    got = {job["student"]: result for job, result, _ in pool.run([_job("eve"), _job("fay")])}
    assert pool.submitted == [["eve"], ["fay"], ["eve"], ["eve"]]
    assert got["fay"].score == 12.0
    assert got["eve"].retry and got["eve"].status == "error" and "failed 3 time(s)" in got["eve"].message
    assert [t.message for t in got["eve"].tests] == ["not graded"] * len(got["eve"].tests)


def test_shards_are_even_and_keep_a_lab_together():
    jobs = [{"lab": lab, "student": f"s{i}"} for i in range(5) for lab in ("b02", "b01")]
    shards = slurm.split_shards(jobs, 3)
    assert [len(s) for s in shards] == [3, 3, 4]
    assert [j["lab"] for j in shards[0]] == ["b01"] * 3 and [j["lab"] for j in shards[2]] == ["b02"] * 4
    assert slurm.split_shards(jobs[:2], 8) == [[jobs[1]], [jobs[0]]]
