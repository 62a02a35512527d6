"""`camp grade --on slurm`: a class graded as one Slurm job array (submitit), shard by shard.

The grading host prepares every submission as for local grading (autograder.grading.grade: the
uploads checked and copied into the workspace, the labs registered, finished results skipped),
then hands the jobs to a `SlurmPool` instead of a `GradingPool`: same contract, `run(jobs)`
yields (job, result, starved) and the host publishes each result into the one gradebook,
grades.csv and report. The pool splits the jobs into shards and submits them as ONE `sbatch
--array` (submitit's `map_array`, at most `slots` tasks running at once). Each task
(`grade_shard`, on a compute node) grades its shard with the local code path: a `GradingPool`
of one warm worker, `worker.grade_job` per submission in the same sandbox, and writes each
finished result atomically (results.save_result) as soon as it has it.

What survives what:
- a hostile submission: it runs in its own sandbox, as locally; if it still kills the task's
  worker process, the shard's other students are graded again each in a fresh worker, so only
  that submission is lost (a grader error, retried by the next `camp grade`);
- a preempted or timed-out task: Slurm requeues a preempted one (PreemptMode=REQUEUE), submitit
  checkpoints and requeues one that runs out of time (`ShardTask` is Checkpointable); either
  way the requeued task skips the students whose result file is already written;
- a failed or cancelled task (node failure, out of memory, scancel): as soon as it has ended,
  its students without a result file are submitted again (a new, smaller array; each student
  is tried `attempts` times, then reported as a grader error), never the ones already graded;
- a killed `camp grade`: its next run skips every submission with a result file (the result's
  key hashes the submission, the lab and the grader), as locally.

Job state: a task has ended when it is no longer in `squeue` (Slurm lists pending, running,
suspended and requeued jobs there, with or without accounting), and it delivered when its result
pickle exists. submitit's own state tracking needs `sacct`, i.e. slurmdbd; the one-node Slurm of
the tests and benchmark (course/slurm) has no accounting, where `sacct` only answers "Slurm
accounting storage is disabled" and submitit would wait forever on a task that died without a
result. Clusters with accounting work the same way.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .results import SubmissionResult, TestOutcome, load_result, save_result

__all__ = ["SlurmOptions", "SlurmPool", "ShardTask", "grade_shard", "split_shards", "slurm_problem"]


@dataclass
class SlurmOptions:
    shards: int | None = None        # tasks in the array (default: as many as the slots)
    partition: str | None = None     # default: the cluster's default partition
    minutes: int = 60                # time limit of each task
    cpus_per_task: int = 1
    mem_gb: float | None = None      # per task (default: the sandbox's memory limit + 3 GB for the grader)
    attempts: int = 3                # arrays submitted at most: the first, then one per retry of the unfinished
    poll_seconds: float = 1.0
    grace_seconds: float = 15.0      # a result pickle may appear this late on a shared file system
    extra: tuple[str, ...] = ()      # more sbatch options, "--account=cs101" (slurm_additional_parameters)


def slurm_problem() -> str | None:
    """Why Slurm cannot take jobs from here, or None."""
    for tool in ("sbatch", "squeue", "srun"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH (no Slurm client here)"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`scontrol ping` failed: {exc}"
    if "UP" not in ping.stdout:
        return f"no Slurm controller answers (`scontrol ping`: {(ping.stdout + ping.stderr).strip()[:200]})"
    return None


def split_shards(jobs: list[dict], shards: int) -> list[list[dict]]:
    """Contiguous, even shards of the jobs sorted by lab then student: a task warms up few labs."""
    ordered = sorted(jobs, key=lambda j: (j["lab"], j["student"]))
    n = max(1, min(shards, len(ordered)))
    return [ordered[len(ordered) * i // n: len(ordered) * (i + 1) // n] for i in range(n)]


# ---------------------------------------------------------------- on the compute node

def grade_shard(shard: list[dict], out: str) -> list[dict]:
    """Grade one shard in this process's own warm worker; save each finished result atomically.

    Returns [{"student", "lab", "result", "starved"}] for the submissions graded here (a requeued
    task skips the ones already saved: the host reads those from their files). A starved result
    (timed out while short of CPU) is returned, not saved: the host grades it again alone."""
    from .readiness import resolve_isolation
    from .pool import WORKER_DIED, GradingPool
    from .uploads import remove_tree

    out_dir = Path(out)
    todo = [job for job in shard
            if load_result(out_dir, job["lab_name"], job["student"], job["key"]) is None]
    if not todo:
        return []
    isolation = resolve_isolation(todo[0]["isolation"])   # this node's sandbox, checked as on the host
    scratch = Path(tempfile.mkdtemp(prefix="camp-sandboxes-"))   # on this node, root-only
    todo = [{**job, "scratch_root": str(scratch), "isolation": isolation} for job in todo]
    warm = list({job["source"]: (job["source"], job["forbid"]) for job in todo}.values())
    threads = todo[0]["threads"]
    delivered: list[dict] = []

    def keep(job: dict, result: SubmissionResult, starved: bool) -> None:
        if not starved:
            try:
                save_result(out_dir, job["lab_name"], result, job["key"])   # skips retry results
            except OSError as exc:
                result.notes.append(f"grader: the result could not be saved ({exc.strerror}); it is regraded next run")
        delivered.append({"student": job["student"], "lab": job["lab"], "result": result.to_dict(),
                          "starved": starved})

    try:
        lost = []
        with GradingPool(1, isolation, threads, warm) as pool:
            for job, result, starved in pool.run(todo):
                if result.retry and result.message.startswith(WORKER_DIED):
                    lost.append(job)   # the worker died: it took the rest of its queue with it
                else:
                    keep(job, result, starved)
        for job in lost:   # each alone in a fresh worker: a submission that kills one loses only itself
            with GradingPool(1, isolation, threads, warm) as pool:
                for job, result, starved in pool.run([job]):
                    keep(job, result, starved)
    finally:
        try:
            remove_tree(scratch)
        except OSError:
            pass
    return delivered


try:
    from submitit.helpers import Checkpointable as _Checkpointable
except ImportError:   # submitit is a dependency; without it only --on slurm is unavailable
    _Checkpointable = object


class ShardTask(_Checkpointable):
    """An array task's callable. Checkpointable: on preemption or timeout submitit requeues the
    task with the same shard, and `grade_shard` skips what is already saved."""

    def __call__(self, shard: list[dict], out: str) -> list[dict]:
        return grade_shard(shard, out)


# ---------------------------------------------------------------- on the grading host

class SlurmPool:
    """The `GradingPool` contract on a Slurm cluster: `run(jobs)` yields (job, result, starved)."""

    def __init__(self, out: Path, slots: int, options: SlurmOptions, memory_mb: int):
        from .readiness import GradingSetupError
        try:
            import submitit
        except ImportError as exc:
            raise GradingSetupError(f"--on slurm needs submitit ({exc}): `make setup` installs it") from exc
        problem = slurm_problem()
        if problem:
            raise GradingSetupError(f"--on slurm: {problem}")
        self.out, self.slots, self.options = out, max(1, slots), options
        self.folder = out / "slurm"
        self._submitit = submitit
        self._mem_gb = options.mem_gb or round(memory_mb / 1024 + 3, 1)
        self._arrays: list[str] = []   # submitted: close() cancels what is still queued

    def _submit(self, shards: list[list[dict]], slots: int):
        executor = self._submitit.AutoExecutor(folder=self.folder / "%j", cluster="slurm")
        o = self.options
        params = dict(name="camp-grade", timeout_min=o.minutes, cpus_per_task=o.cpus_per_task,
                      mem_gb=self._mem_gb, slurm_array_parallelism=max(1, slots))
        if o.partition:
            params["slurm_partition"] = o.partition
        if o.extra:
            params["slurm_additional_parameters"] = dict(_sbatch_option(x) for x in o.extra)
        executor.update_parameters(**params)
        tasks = executor.map_array(ShardTask(), shards, [str(self.out)] * len(shards))
        self._arrays.append(tasks[0].job_id.split("_")[0])
        what = f"job array {tasks[0].job_id.split('_')[0]} ({max(1, slots)} task(s) at once" if len(tasks) > 1 \
            else f"job {tasks[0].job_id} (one task"
        print(f"camp grade: {sum(map(len, shards))} submission(s) in {len(shards)} shard(s): Slurm {what}; "
              f"logs in {self.folder})", flush=True)
        return tasks

    def run(self, jobs: list[dict]):
        tries: dict[tuple[str, str], int] = {}
        open_: list[tuple] = []   # (task, its shard, when it left the queue without a result)

        def submit(group: list[dict]) -> None:
            shards = split_shards(group, self.options.shards or self.slots)
            tasks = self._submit(shards, min(self.slots, len(shards)))
            open_.extend([task, shard, None] for task, shard in zip(tasks, shards))
            for job in group:
                tries[_who(job)] = tries.get(_who(job), 0) + 1

        submit(jobs)
        unreachable_since = None
        while open_:
            queued = {a: _queued_tasks(a) for a in {t.job_id.split("_")[0] for t, _, _ in open_}}
            if any(q is None for q in queued.values()):
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > 600:
                    raise RuntimeError("squeue has not answered for 10 minutes")
            else:
                unreachable_since = None
            for entry in list(open_):
                task, shard, gone = entry
                delivered, reason = None, None
                if task.paths.result_pickle.exists():
                    try:
                        delivered, reason = task.result(), ""
                    except Exception as exc:   # the shard's function raised: its saved results still count
                        reason = f"task {task.job_id} raised {_last_line(exc)}"
                elif queued.get(task.job_id.split("_")[0]) is not None and task.job_id not in queued[task.job_id.split("_")[0]]:
                    entry[2] = gone = gone or time.monotonic()
                    if time.monotonic() - gone > self.options.grace_seconds:
                        reason = f"task {task.job_id} ended without a result ({_tail(task.paths.stderr)})"
                if reason is None:
                    continue
                open_.remove(entry)
                got = {(d["student"], d["lab"]): d for d in delivered or ()}
                again = []
                for job in shard:
                    saved = None if _who(job) in got else load_result(self.out, job["lab_name"], job["student"], job["key"])
                    if _who(job) in got:
                        yield job, SubmissionResult.from_dict(got[_who(job)]["result"]), got[_who(job)]["starved"]
                    elif saved:
                        yield job, saved, False
                    elif tries[_who(job)] < self.options.attempts:
                        again.append(job)
                    else:
                        yield job, _not_graded(job, f"the Slurm task grading it failed {tries[_who(job)]} time(s), "
                                                    f"last: {reason or 'it ended without grading it'}; run again to retry"), False
                if again:   # at once: the other tasks may still be running
                    print(f"camp grade: {len(again)} submission(s) left ungraded: "
                          f"{reason or f'task {task.job_id} ended without grading them'}; submitting them again",
                          file=sys.stderr, flush=True)
                    submit(again)
            if open_:
                time.sleep(self.options.poll_seconds)

    def close(self) -> None:
        """Cancel this run's tasks still pending or running: an interrupted `camp grade`, or a
        task requeued after it delivered (its results are in)."""
        for array_id in self._arrays:
            left = _queued_tasks(array_id, states="PD,R,S")
            if left:
                try:
                    subprocess.run(["scancel", *sorted(left)], capture_output=True, timeout=30)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        self._arrays = []

    def __enter__(self) -> "SlurmPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _who(job: dict) -> tuple[str, str]:
    return job["student"], job["lab"]


def _queued_tasks(array_id: str, states: str | None = None) -> set[str] | None:
    """Task ids ("123_4") Slurm still holds (squeue's default: pending, running, suspended,
    requeued, completing; or `states`); None if squeue cannot answer."""
    try:
        p = subprocess.run(["squeue", "-h", "-r", "-j", array_id, "-o", "%i", *(["-t", states] if states else [])],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return set() if "Invalid job id" in p.stderr else None   # purged: every task has ended
    return {line.strip() for line in p.stdout.splitlines() if line.strip()}


def _not_graded(job: dict, message: str) -> SubmissionResult:
    from ..course.labspec import LabSpec
    spec = LabSpec.from_notebook(Path(job["source"]))
    return SubmissionResult(job["student"], job["lab"], "error", max_score=spec.max_score, message=message,
                            retry=True, tests=[TestOutcome(t.grade_id, t.points, 0.0, "not graded") for t in spec.tests])


def _sbatch_option(text: str) -> tuple[str, str]:
    name, _, value = text.lstrip("-").partition("=")
    return name.replace("-", "_"), value


def _last_line(exc: Exception) -> str:
    lines = [l for l in str(exc).splitlines() if l.strip() and not l.startswith("-")]
    tail = [l for l in lines if "Error" in l or "error" in l]
    return (tail or lines or [type(exc).__name__])[-1].strip()[:300]


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return (lines[-1][:300] if lines else "empty log") + f"; log: {path}"
