"""Grading one submission: the student's cells run in their sandbox, the course's tests run
here, in a clean trusted process, against stand-ins for the student's objects.

A crash or timeout costs only what it hits: a cell that kills or hangs the student's process is
skipped and the process restarted with the cells before it replayed; a test that does so scores
0 and the next test gets a fresh process. Forbidden APIs score 0 on the tests they affect:
decided by the trusted static scan of everything the submission can run (static_check), and
by the runtime observer in the student's process, whose reports reach the grader on a channel
the student cannot take them back from (every forbidden call while a test runs counts, whoever's
code made it), believed only while the canaries the grader sends after every test come back.
Whatever goes wrong because of the student's output is their failed test, never a retried
grading error.

Hidden cases use `seed`, fresh for every grading run (set after the parameters cell, in the
trusted namespace only) and recorded in the result, so they cannot be predicted or replayed.
"""
from __future__ import annotations

import contextlib
import io
import secrets
import time
import traceback
from pathlib import Path

from .. import checks
from ..course.labspec import HIDDEN, LabSpec
from ..isolation.sandbox import Sandbox, StudentCrashed
from ..tracebacks import notebook_cells
from .forbid import unparsable_cell
from .observe import canary_plan
from .program import build_program
from .rank_pool import RankPool
from .remote import RemoteObject, Session, StudentError
from .results import SubmissionResult, TestOutcome
from .static_check import banned_tests
from .uploads.files import SubmissionError
from .uploads.notebooks import parse_notebook

MAX_MESSAGE = 2000


class _Student:
    """The student's sandbox plus the cells that define their code, replayed after a restart."""

    def __init__(self, sandbox: Sandbox, deadline: float):
        self.sandbox, self.deadline = sandbox, deadline
        self.ran: list[tuple[str, str, str]] = []   # (source, its label, its exercise)
        self.session: Session | None = None
        self.pool: RankPool | None = None   # rank sandboxes in this sandbox's network (the main one only)

    def restart(self) -> None:
        self.start()
        self.replay()

    def start(self) -> None:
        if self.pool is not None:   # they live in the old process's network namespace
            self.pool.close()
        self.sandbox.start()
        self.session = Session(self.sandbox, self.deadline, ranks=self.pool)

    def replay(self) -> None:
        """Run again the cells that ran (after a restart, or in a rank's sandbox)."""
        for source, cell, exercise in self.ran:
            self._exec(source, cell, exercise)

    def _exec(self, source: str, cell: str = "", exercise: str = ""):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise StudentCrashed("the notebook's total time limit was reached")
        header, _ = self.sandbox.request({"op": "exec", "source": source, "cell": cell, "exercise": exercise},
                                         timeout=min(self.sandbox.limits.cell_seconds, left))
        return header.get("value")

    def run_cell(self, source: str, cell: str = "", exercise: str = "") -> str | None:
        """Run a cell; its error message (None if it ran). A crash or timeout skips the cell.
        `cell` and `exercise` name it in tracebacks ("cell 8, line 3")."""
        try:
            error = self._exec(source, cell, exercise)
        except StudentCrashed as exc:
            self.restart()
            return f"{exc} (the cell was skipped)"
        self.ran.append((source, cell, exercise))
        return error


def grade_submission(spec: LabSpec, notebook: Path, student: str, lab_id: str, sandbox: Sandbox,
                     forbid: list[str], seed: int | None = None) -> SubmissionResult:
    start = time.monotonic()
    seed = new_seed() if seed is None else int(seed)
    result = SubmissionResult(student, lab_id, "graded", max_score=spec.max_score)
    result.seed = seed
    try:
        if not notebook.exists():
            others = sorted(p.name for p in notebook.parent.glob("*.ipynb"))
            raise ValueError(f"no {notebook.name} in the submission" + (f" (found {', '.join(others)})" if others else ""))
        repairs: list[str] = []
        nb = parse_notebook(notebook.read_bytes(), notebook.name, repairs)   # the upload check's own rule
    except Exception as exc:
        result.status = "error"
        result.message = (str(exc)[:300] if isinstance(exc, (ValueError, SubmissionError)) else
                          f"not a valid notebook: {str(exc).splitlines()[0][:200]}")
        result.tests = [TestOutcome(t.grade_id, t.points, 0.0, "not graded: the notebook could not be read") for t in spec.tests]
        return result
    try:   # deterministic for a given notebook: a failure here is never retried
        program = build_program(spec, nb)
        result.notes = repairs + program.notes
        banned = banned_tests(spec, program.cells, forbid, notebook.parent, Path(spec.folder) if spec.folder else None)
    except Exception as exc:
        result.status, result.message = "error", f"the notebook could not be graded: {type(exc).__name__}: {exc}"[:300]
        result.tests = [TestOutcome(t.grade_id, t.points, 0.0, "not graded: " + result.message) for t in spec.tests]
        return result
    if spec.tests and all(t.grade_id in banned for t in spec.tests):   # nothing left to run their code for
        result.tests = [TestOutcome(t.grade_id, t.points, 0.0, banned[t.grade_id]) for t in spec.tests]
        result.message = f"not run: {banned[spec.tests[0].grade_id]}"[:300]
        result.seconds = round(time.monotonic() - start, 2)
        return result
    student_proc = _Student(sandbox, start + sandbox.limits.notebook_seconds)
    plan = [list(item) for item in canary_plan(tuple(forbid)) if not _left_out(item[0], sandbox.hide)] if forbid else []
    started = False
    try:
        sandbox.start()     # before any student code: a failure here is the grader's, retried next run
        student_proc.pool = RankPool(student_proc, plan, lambda box: _Student(box, student_proc.deadline),
                                     _observer_failed)
        student_proc.session = Session(sandbox, student_proc.deadline, ranks=student_proc.pool)
        started = True
        if any("separate_ranks(" in t.source for t in spec.tests):   # the fewest ranks such a test runs on,
            student_proc.pool.prestart(2)                              # starting while the cells run
        exercise_of = {c.label: c.exercise for c in notebook_cells(nb.cells)}
        for label, source, _ in program.cells:
            cell = label.partition(" (")[0]          # "cell 8 (softmax)" -> "cell 8"
            error = unparsable_cell(source) or student_proc.run_cell(source, cell, exercise_of.get(cell, ""))
            if error:
                result.cell_errors.append(f"{label}: {error}"[:MAX_MESSAGE])
        result.cells_seconds = round(time.monotonic() - start, 2)
        trusted = _trusted_namespace(spec, seed)
        for test in spec.tests:
            began = time.monotonic()
            result.tests.append(_run_test(test, trusted, spec, student_proc, banned.get(test.grade_id), plan))
            result.tests[-1].seconds = round(time.monotonic() - began, 2)
    except StudentCrashed as exc:  # the process could not be (re)started
        result.status, result.message = "error", str(exc)
        result.retry = not started   # once the student's code ran, a dead process is their outcome
    finally:
        if student_proc.pool is not None:
            student_proc.pool.close()
        sandbox.close()
    done = {t.grade_id for t in result.tests}
    result.tests += [TestOutcome(t.grade_id, t.points, 0.0, "not graded: " + (result.message or "stopped"))
                     for t in spec.tests if t.grade_id not in done]
    result.score = sum(t.score for t in result.tests)
    result.seconds = round(time.monotonic() - start, 2)
    return result


def warm_up(spec: LabSpec, forbid: list[str]) -> None:
    """What grading a first submission of this lab does once per process (the canary plan, the
    lab's setup cells and their imports), done ahead, before any student's code is involved."""
    if forbid:
        canary_plan(tuple(forbid))
    _trusted_namespace(spec, 0)


def new_seed() -> int:
    """A fresh seed for one grading run's hidden cases (camp grade --seed N reproduces a run)."""
    return secrets.randbelow(2**31)


def _trusted_namespace(spec: LabSpec, seed: int) -> dict:
    ns: dict = {"__name__": "__camp_grader__"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(spec.parameters, "<parameters>", "exec"), ns)
        ns["device"] = "cpu"   # grading compares on the CPU, whatever the lab's profile
        ns["seed"] = seed      # hidden cases nobody saw before this run
        for i, source in enumerate(spec.setup):
            exec(compile(source, f"<setup {i}>", "exec"), ns)
    return ns


def _run_test(test, trusted: dict, spec: LabSpec, student: _Student, banned: str | None,
              plan: list | None = None) -> TestOutcome:
    if banned:
        return TestOutcome(test.grade_id, test.points, 0.0, banned)
    student.sandbox.read_reports()   # what the cells or an earlier test's canaries reported: not this test's
    ns = dict(trusted)
    ns.update({name: RemoteObject(student.session, name, name) for name in spec.student_names})
    out = io.StringIO()
    message = ""
    hidden_failed = False
    checks._grading_session = student.session   # `make` builds in the student's process
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(test.source, f"<{test.grade_id}>", "exec"), ns)
    except Exception as exc:
        hidden_failed = failed_in_hidden(exc, test)
        if isinstance(exc, StudentError):
            message = str(exc)
        elif isinstance(exc, AssertionError):
            message = str(exc) or "a check failed"
        else:  # the test tripped over what the student's code returned
            message = f"{type(exc).__name__}: {exc} ({_where(exc, test.grade_id)})"
    finally:
        checks._grading_session = None
    hits, sound = student.sandbox.read_reports() if student.sandbox.proc is not None else (set(), True)
    tampered = _observer_failed(student, plan or [], sound)
    on_ranks = student.pool.verdict() if student.pool is not None else ""   # the grader's own ranks
    if on_ranks.startswith("your code called"):
        message = on_ranks + (f" ({message})" if message else "")
    else:
        tampered = tampered or on_ranks
    if hits:  # the reason for the zero, whatever else went wrong
        message = f"your code called {', '.join(sorted(hits))}, which this lab forbids" + (f" ({message})" if message else "")
    elif tampered:
        message = tampered + (f" ({message})" if message else "")
    if hidden_failed:   # a random case failed: the seed reproduces it (not said when a visible one did)
        message = message[:MAX_MESSAGE - 60] + f" [this run's hidden cases used seed {trusted.get('seed')}]"
    if student.sandbox.proc is None:  # the test crashed the student's process: fresh one for the next
        student.restart()
    return TestOutcome(test.grade_id, test.points, 0.0 if message else test.points,
                       message[:MAX_MESSAGE], out.getvalue()[-MAX_MESSAGE:])


def _observer_failed(student: _Student, plan: list, sound: bool = True) -> str:
    """Why the runtime observer cannot be believed after this test ("" when it passed): its
    channel must be intact (`sound`: open, nothing but reports on it) and every planned canary's
    report must reach the grader, with a fresh seed so no answer can be prepared. What else
    arrives meanwhile is not counted: the canaries are the grader's calls."""
    if student.sandbox.proc is None:
        return ""
    if not sound:
        return ("the grader's forbidden-API observer channel was closed or written to by your code "
                "(tampering): this test scores 0")
    if not plan:
        return ""
    try:
        student.session.request("canary", "the forbidden-API check", plan=plan, seed=new_seed())
    except Exception as exc:  # noqa: BLE001 - the student's process failed to answer: their outcome
        return f"the grader's forbidden-API check could not run in your process ({exc}): this test scores 0"
    reported, sound = student.sandbox.read_reports()
    missing = sorted({entry for entry, _, _ in plan if entry not in reported})
    if missing or not sound:
        return ("the grader's forbidden-API observer stopped seeing calls in your process (canary for "
                f"{', '.join(missing) or 'the channel'} missing; tampering?): this test scores 0")
    return ""


def failed_in_hidden(exc: BaseException, test) -> bool:
    """True when the test cell's line that raised lies between its `### BEGIN HIDDEN TESTS` and
    `### END HIDDEN TESTS` markers: a hidden (random, seeded) case failed, not a visible one."""
    lines = {f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == f"<{test.grade_id}>"}
    for block in HIDDEN.finditer(test.source):   # any frame: a hidden case may call a visible helper
        first = test.source.count("\n", 0, block.start()) + 1
        last = first + block.group(0).rstrip("\n").count("\n")
        if any(line is not None and first <= line <= last for line in lines):
            return True
    return False


def _left_out(entry: str, hidden: tuple[str, ...]) -> bool:
    """True when `entry` lives in a camplib module the sandbox leaves out (no canary can call it
    there; the student cannot either)."""
    from .entries import resolve
    module = getattr(resolve(entry), "__module__", None) or ""
    return any(name == h or name.startswith(h + ".") for name in (entry, module) for h in hidden)


def _where(exc: BaseException, grade_id: str) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == f"<{grade_id}>"]
    return f"test line {frames[-1].lineno}" if frames else "in the test"
