"""Every ready lab, end to end, one test per lab and step so pytest-xdist spreads them:

- its solution notebook executes with papermill in the `ci` profile within the CI budget; a lab
  that forks ranks (its notebook names camplib.dist or camplib.parallel, whose runners fork them)
  runs it in a kernel that counts a fake accelerator (tests/fake_accelerator.py), so that a
  backward in the notebook's own process before its ranks fork fails here as on a GPU;
- graded by the real grader, the reference solution scores full marks, the blank release 0,
  and each typical mistake (tests/course/mistakes/<lab>.py) loses exactly its exercise's points
  with a message that helps.
"""
import json
import warnings

import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.execute import CI_BUDGET_S, run_lab
from autograder.course.labspec import LabSpec
from autograder.course.reference import (
    solution_cells,
    student_notebook,
    write_submission,
)
from autograder.grading.grade import GradeOptions, grade
from tests import fake_accelerator
from tests.course.mistakes import mistakes_of

ROOT = repo_root()
LABS = Catalog.load().ready()
IDS = [lab.id for lab in LABS]


def forks_ranks(lab) -> bool:
    source = lab.source_path(ROOT).read_text()
    return "camplib.dist" in source or "camplib.parallel" in source


def test_every_ready_lab_has_a_typical_mistake():
    missing = [lab.id for lab in LABS if not mistakes_of(lab.id)]
    assert missing == [], f"add a typical mistake for {missing} in tests/course/mistakes/<lab>.py"


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_solution_runs_in_the_ci_profile_within_budget(lab, tmp_path, monkeypatch):
    """Timed like timeit: the best of at most two runs. Under xdist the other worker may be
    grading hostile submissions that spin on purpose; one slow run (on CI once: b01, 137 s, when
    it runs in 14 s alone) is reported loudly with where its time went, then measured again.
    A lab that forks ranks runs as on a GPU machine: no autograd in the notebook's process before
    its ranks fork (a02 and a03 failed so on an H200; they compute references with in_child)."""
    if forks_ranks(lab):
        monkeypatch.setenv("IPYTHONDIR", str(fake_accelerator.kernel_startup(tmp_path)))
    result = run_lab(lab, ROOT, tmp_path / "first", "ci")
    assert result.ok, f"{lab.id}: {result.message}"
    assert not forks_ranks(lab) or fake_accelerator.registered_in(tmp_path), \
        f"{lab.id}: the kernel never registered the fake accelerator: its run checked nothing about autograd and fork"
    print(f"{lab.id}: ci profile ran in {result.seconds:.1f} s")
    if result.seconds >= CI_BUDGET_S:
        slow = f"{lab.id}: ci profile took {result.seconds:.1f} s ({result.slowest_cells()})"
        warnings.warn(f"{slow}; measuring it again")
        result = run_lab(lab, ROOT, tmp_path / "again", "ci")
        assert result.ok, f"{lab.id} (second run): {result.message}"
        print(f"{lab.id}: second run {result.seconds:.1f} s")
        assert result.seconds < CI_BUDGET_S, (f"{slow}; again {result.seconds:.1f} s ({result.slowest_cells()}); "
                                              f"budget {CI_BUDGET_S:.0f} s")


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS, ids=IDS)
def test_reference_full_blank_zero_each_mistake_loses_its_exercise(lab, tmp_path):
    subs = tmp_path / "submissions"
    write_submission(subs, "reference", lab.id, student_notebook(lab.id))
    write_submission(subs, "blank", lab.id, student_notebook(lab.id, solve=False))
    mistakes = mistakes_of(lab.id)
    for i, mistake in enumerate(mistakes):
        code = mistake.code()
        assert code != solution_cells(lab.id)[mistake.grade_id], f"{lab.id} mistake {i} changes nothing"
        write_submission(subs, f"mistake{i}", lab.id, student_notebook(lab.id, {mistake.grade_id: code}))
    out = tmp_path / "ws"
    rows = {r.student: r for r in grade(subs, Catalog.load(), ROOT, out, lab.id, GradeOptions(jobs=1))}
    spec = LabSpec.from_notebook(lab.source_path(ROOT))
    assert rows["reference"].score == spec.max_score > 0, rows["reference"]
    assert rows["blank"].score == 0, rows["blank"]
    for i, mistake in enumerate(mistakes):
        row = rows[f"mistake{i}"]
        assert row.score == spec.max_score - mistake.points_lost, (mistake.grade_id, row)
        result = json.loads((out / "results" / lab.name / f"mistake{i}.json").read_text())["result"]
        messages = " | ".join(t["message"] for t in result["tests"] if t["message"])
        assert mistake.hint in messages, (mistake.grade_id, messages)
