"""The ranks of a distributed test, started by the grader: one sandbox per rank, each holding
only its own input, all sharing the student's sandbox's loopback network and nothing else.

A runner that the course starts in the student's process (camplib.dist.harness.run_collective,
forking its ranks there) is the student's answer: a submission can replace it, and its ranks
share one process's memory, /tmp, /dev/shm and pipes, so a correct result proves nothing
(every rank can read every input) and bytes on the loopback can be junk. Here each rank is a
fresh student process in a sandbox of its own (autograder.isolation.sandbox, `net_of`): its own
files, /tmp and /dev/shm, IPC and PID namespaces and leased uid, the student's cells replayed
in it, and its forbidden-API observer checked with canaries as the main one is. The grader
hands rank r its own `per_rank[r]` over that rank's own wire and asks it to join the process
group (camplib.dist.separate.join_and_run); the loopback network is the only channel between
ranks, so outputs that depend on every rank's input prove that data travelled, and the bytes
the grader counts on that network (Sandbox.loopback_bytes) bound how much. Where the rank
function pauses (a generator's `yield`, camplib.dist.separate), the grader measures what each
rank holds there, from outside (Sandbox.resident_bytes: every process of the sandbox and its
tmpfs), while the rank waits for the next request: "resident_bytes", per rank, per pause.
Each rank's observer
also reports every torch.distributed collective it calls (autograder.grading.observe), so the
"collectives" a run returns are the grader's own observation, not the rank's count.
"""
from __future__ import annotations

import functools
import re
import secrets
import threading

from ..isolation.sandbox import Sandbox, StudentCrashed
from .observe import COLLECTIVE_ENTRIES, collective_name, collective_plan
from .remote import RemoteObject, Session, StudentError

JOIN = "camplib.dist.separate.join_and_run"
RESUME = "camplib.dist.separate.resume"
MAX_PAUSES = 64   # a rank function's yields (a02's: one per optimizer step); more is the student's doing


class RankPool:
    """Rank sandboxes beside `main` (engine._Student), started when a test first needs them and
    kept for the submission's later tests. `new_student(sandbox)` makes a rank's _Student;
    `observer_failed(student, plan, sound)` is the engine's check of an observer."""

    def __init__(self, main, plan: list, new_student, observer_failed):
        self.main, self.plan = main, plan
        self.new_student, self.observer_failed = new_student, observer_failed
        self.ranks: list = []
        # the store's port, below the kernel's ephemeral range (32768-60999): a port from inside it can
        # be the local end of a connection already open in the shared network namespace (EADDRINUSE: an
        # honest reference lost 3 of b06's points to it in a full run); +1 per run, so room is left
        self._port = 20000 + secrets.randbelow(10000)
        self._used = 0          # ranks the current test ran on (their observers are checked at its end)
        self._found = ""        # a verdict from ranks closed during the test (crashed or timed out)
        self._held: dict[int, tuple[set, bool]] = {}   # rank -> (forbidden reports, sound) read during the test

    def prestart(self, n: int) -> None:
        """Launch rank sandboxes 0..n-1 now and let them start (interpreter, torch, the observer)
        in the background, while the student's cells run in `main`: a test that needs them then
        only replays the cells there. Nothing of the student's runs in them before that replay.
        Only a head start: if they cannot start now, the test that needs them starts them."""
        try:
            self._add(n)
        except Exception:  # noqa: BLE001 - run() starts them again and reports what fails then
            self.close()

    def _add(self, n: int) -> list:
        main = self.main.sandbox
        new = []
        while len(self.ranks) < n:
            r = len(self.ranks)
            sandbox = Sandbox(main.staging, isolation=main.isolation, limits=main.limits, forbid=main.forbid,
                              threads=1, log=main.log.with_name(f"{main.log.name}.rank{r}"), hide=main.hide,
                              net_of=main)
            student = self.new_student(sandbox)
            student.replayed = False
            self.ranks.append(student)
            new.append(student)
        for student in new:   # from this thread: a sandbox dies with the thread that started it
            student.sandbox.launch()
            student.starting = _Waiting(student)
        return new

    def _ensure(self, n: int) -> None:
        """Rank sandboxes 0..n-1, the missing ones started side by side, each replaying the cells
        that ran in `main` (those started ahead by `prestart` replay them now)."""
        self._add(n)
        fresh = [student for student in self.ranks[:n] if not student.replayed]
        errors = _side_by_side([functools.partial(_ready, student, self.main.ran) for student in fresh])
        if errors:
            raise errors[0]
        for student in fresh:
            student.sandbox.read_reports()   # what starting and replaying reported: not a test's

    def run(self, path: str, fn, per_rank: list, timeout: float = 30.0) -> dict:
        """on_ranks' format of the rank function `path`(rank, world_size, fn, per_rank[rank]),
        each rank in its own sandbox. `fn`: the student's function or class (or a tuple of them),
        by the name their notebook gives it."""
        for one in fn if isinstance(fn, (list, tuple)) else [fn]:
            if not (isinstance(one, RemoteObject) and isinstance(one._as_handle(), str)):
                raise TypeError("separate ranks run functions or classes the notebook defines, passed by name")
        n = len(per_rank)
        try:
            self._ensure(n)
        except StudentCrashed as exc:
            self.close()
            raise StudentError(f"the grader could not start your code on {n} ranks: {exc}") from None
        self._used = max(self._used, n)
        self._port += 1
        port = self._port
        replies = [None] * n

        def one(r: int):
            def call():
                replies[r] = self.ranks[r].session.make(JOIN, [path, fn, r, n, port, per_rank[r]], {"timeout": timeout})
            return call

        errors = _side_by_side([one(r) for r in range(n)], every=True)
        held: list[list[int]] = [[] for _ in range(n)]
        while not any(errors) and all(reply == {"paused": True} for reply in replies) and len(held[0]) < MAX_PAUSES:
            try:
                for r in range(n):   # every rank waits for the next request: what it holds now, it keeps
                    held[r].append(self.ranks[r].sandbox.resident_bytes())
            except (StudentCrashed, OSError) as exc:
                errors = [StudentError(f"its memory could not be measured: {exc}") if i == r else None for i in range(n)]
                break

            def going(r: int):
                def call():
                    replies[r] = self.ranks[r].session.make(RESUME, [], {})
                return call
            errors = _side_by_side([going(r) for r in range(n)], every=True)
        collectives = [self._collectives(r) for r in range(n)]
        if any(self.ranks[r].sandbox.proc is None for r in range(n)):   # crashed or timed out:
            self._found = self._found or self._observers(canaries=False)  # what they reported first,
            self.close()                                                  # fresh ones next time
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            raise _first_cause(failed, n)
        if not all(isinstance(reply, dict) and "returned" in reply for reply in replies):
            raise StudentError(f"the ranks paused a different number of times ({len(held[0])} measured): "
                               "each rank runs the same rank function")
        out = {key: [reply["returned"][key] for reply in replies] for key in replies[0]["returned"]}
        out["resident_bytes"] = held
        out["bytes_sent"] = [reply["bytes_sent"] for reply in replies]
        out["calls"] = [reply["calls"] for reply in replies]
        out["collectives"] = collectives
        return out

    def _collectives(self, r: int) -> list[str]:
        """The collectives rank r's observer reported since the last read (ProcessGroup names,
        sorted); its other reports are kept for the test's verdict."""
        sandbox = self.ranks[r].sandbox
        if sandbox.reports is None:
            return []
        hits, sound = sandbox.read_reports()
        held, was_sound = self._held.get(r, (set(), True))
        self._held[r] = (held | (hits - set(COLLECTIVE_ENTRIES)), was_sound and sound)
        return sorted(collective_name(e) for e in hits & set(COLLECTIVE_ENTRIES))

    def verdict(self) -> str:
        """At the end of a test: why the observers of the ranks it ran on convict it (a forbidden
        call on a rank) or cannot be believed (their channel or canaries failed); "" when they pass."""
        found = self._found or self._observers(canaries=True)
        self._used, self._found, self._held = 0, "", {}
        return found

    def _observers(self, canaries: bool) -> str:
        for r, student in enumerate(self.ranks[:self._used]):
            alive = student.sandbox.proc is not None and student.sandbox.proc.poll() is None
            hits, sound = student.sandbox.read_reports() if student.sandbox.reports is not None else (set(), True)
            held, held_sound = self._held.get(r, (set(), True))
            hits, sound = (hits | held) - set(COLLECTIVE_ENTRIES), sound and held_sound
            if hits:
                return f"your code called {', '.join(sorted(hits))} on rank {r}, which this lab forbids"
            plan = [*self.plan, *(list(item) for item in collective_plan())]
            failed = self.observer_failed(student, plan, sound) if alive and canaries else ""
            if failed:
                return f"rank {r}: {failed}"
        return ""

    def close(self) -> None:
        for student in self.ranks:
            student.sandbox.close()
        self.ranks = []


class _Waiting:
    """A launched rank sandbox becoming ready in a thread of its own (the interpreter and torch
    starting); `wait()` returns once it is, or raises what stopped it."""

    def __init__(self, student):
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._run, args=(student,), daemon=True)
        self.thread.start()

    def _run(self, student) -> None:
        try:
            student.sandbox.await_ready()
        except Exception as exc:  # noqa: BLE001 - raised by wait(), in the test that needs the rank
            self.error = exc

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def _ready(student, ran: list) -> None:
    """Wait for a launched rank sandbox, then replay in it the student's cells `ran`."""
    student.starting.wait()
    student.session = Session(student.sandbox, student.deadline)
    student.ran = list(ran)
    student.replay()
    student.replayed = True


# What a rank reports when another rank's failure broke the process group under it (gloo's errors,
# a collective's timeout): not where the student's mistake is.
_KNOCK_ON = re.compile(r"connection (closed|reset) by peer|broken pipe|timed out|timeout|"
                       r"DistNetworkError|DistBackendError|gloo", re.IGNORECASE)


def _first_cause(failed: list[tuple[int, Exception]], n: int) -> Exception:
    """The error to report when ranks failed: the lowest rank whose own code failed (one that only
    saw the group break under it comes after), with the other ranks' first lines after it, so a
    rank that raised is never hidden behind its peer's "connection closed"."""
    ordered = sorted(failed, key=lambda item: (bool(_KNOCK_ON.search(str(item[1]))), item[0]))
    r, exc = ordered[0]
    if not isinstance(exc, StudentError):
        return exc
    others = "; ".join(f"rank {q}: {(str(e).strip().splitlines() or [type(e).__name__])[0][:200]}" for q, e in ordered[1:])
    return type(exc)(f"rank {r} of {n}: {exc}" + (f"\n(also failed: {others})" if others else ""))


def _side_by_side(calls: list, every: bool = False) -> list:
    """Run `calls` in threads of their own and wait for all; their exceptions (in order; with
    `every`, one entry per call, None where it returned)."""
    errors: list = [None] * len(calls)

    def run(i: int) -> None:
        try:
            calls[i]()
        except Exception as exc:  # noqa: BLE001 - the caller decides
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors if every else [e for e in errors if e is not None]
