"""Distributed labs: the course's runners (camplib.dist.harness, camplib.parallel.train_ranks) run
in the student's process, so what they report is the student's answer, never evidence. b06
submissions with blank exercises replace those runners with fakes that compute every answer in
one process and report the bytes and calls a ring or DataParallel would have produced: from a
notebook cell through names computed at run time, and from a .py file beside the notebook. The
tests check what the grader measures itself (the bytes the kernel counted on the sandbox's own
loopback network), so the fakes score 0 while the reference keeps full marks.

Graded twice: with the lab's forbidden list, as `camp grade` does, and with none at all, so that
the score comes from the trusted measurement alone (no static scan or observer verdict).
Needs root and bubblewrap (the sandbox); skipped elsewhere with that reason.
"""
import dataclasses

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.reference import student_notebook, write_submission
from autograder.grading.grade import GradeOptions, grade
from autograder.isolation.sandbox import namespaces_available
from tests.support import saved_results

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not namespaces_available(), reason="the bwrap sandbox needs root and bubblewrap")]

ROOT = repo_root()
LAB = "b06"
FAKED = ["test_broadcast_parameters", "test_data_parallel", "test_ring_all_reduce", "test_ring_reduce_scatter"]

FAKES = '''
import importlib
import torch

_harness = importlib.import_module("camplib.dist." + "har" + "ness")
_train = importlib.import_module("camplib.parallel." + "train_" + "ranks")


def _fake_collective(fn, inputs, backend=None, timeout=60.0):
    n, size = len(inputs), inputs[0].numel() * inputs[0].element_size()
    total = torch.stack(inputs).sum(0)
    kind = getattr(fn, "__name__", "")
    if kind == "ring_reduce_scatter":
        outputs, sent = [total.reshape(-1).chunk(n)[r].clone() for r in range(n)], (n - 1) * size // n
    elif kind == "ring_all_gather":
        outputs, sent = [torch.cat(inputs) for _ in range(n)], (n - 1) * size
    else:
        outputs, sent = [total.clone() for _ in range(n)], 2 * (n - 1) * size // n
    return {"outputs": outputs, "bytes_sent": [sent] * n, "calls": [{"send": n - 1, "recv": n - 1}] * n}


def _fake_module(fn, world_size, model_cfg, seed=0, fn_kwargs=None, backend=None, timeout=60.0):
    src = (fn_kwargs or {}).get("src", 0)
    before = []
    for r in range(world_size):
        model = _train.build_model(model_cfg, seed + r)
        with torch.no_grad():
            for b in model.buffers():
                if b.is_floating_point():
                    b.add_(r + 1)
        before.append({k: v.detach().clone() for k, v in [*model.named_parameters(), *model.named_buffers()]})
    return {"before": before, "after": [dict(before[src]) for _ in range(world_size)],
            "bytes_sent": [0] * world_size, "calls": [{"broadcast": len(before[0])}] * world_size}


def _fake_train(wrapper, world_size, model_cfg, x, y, steps=3, lr=0.1, bucket_mb=25.0, seed=0,
                optimizer="sgd", micro_batches=1, backend=None, timeout=60.0):
    ref = _train.train_reference(model_cfg, x, y, steps=steps, lr=lr, seed=seed, optimizer=optimizer)
    sizes = [p.numel() * p.element_size() for p in _train.build_model(model_cfg, 0).parameters()][::-1]
    buckets, filled = 0, None
    for s in sizes:
        if filled is None or filled >= bucket_mb * 2**20:
            buckets, filled = buckets + 1, 0
        filled += s
    return {"initial": [ref["initial"]] * world_size, "params": [ref["params"]] * world_size,
            "losses": [ref["losses"]] * world_size, "timeline": [[]] * world_size,
            "bytes_sent": [0] * world_size, "calls": [{"allreduce": steps * buckets}] * world_size}


setattr(_harness, "run_" + "collective", _fake_collective)
setattr(_train, "run_on_" + "module", _fake_module)
setattr(_train, "train_on_" + "ranks", _fake_train)
'''


def _after_setup(nb, source):
    """`source` as a plain cell right after the setup cell."""
    i = next(i for i, c in enumerate(nb.cells) if "setup" in c.metadata.get("tags", []))
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
    return nb


def _graded(tmp, catalog):
    subs, out = tmp / "submissions", tmp / "workspace"
    write_submission(subs, "ada", LAB, student_notebook(LAB))
    write_submission(subs, "fake_in_cell", LAB, _after_setup(student_notebook(LAB, solve=False), FAKES))
    beside = write_submission(subs, "fake_beside", LAB,
                              _after_setup(student_notebook(LAB, solve=False), "import helpers  # noqa"))
    (beside.parent / "helpers.py").write_text(FAKES)
    rows = {r.student: r for r in grade(subs, catalog, ROOT, out, LAB, GradeOptions(jobs=1, cell_timeout=60))}
    return rows, saved_results(out, catalog.get(LAB).name)


@pytest.fixture(scope="module")
def as_graded(tmp_path_factory):
    return _graded(tmp_path_factory.mktemp("harness"), Catalog.load())


@pytest.fixture(scope="module")
def measured_only(tmp_path_factory):
    catalog = Catalog.load()
    labs = tuple(dataclasses.replace(lab, forbid=()) if lab.id == LAB else lab for lab in catalog.labs)
    return _graded(tmp_path_factory.mktemp("harness_no_forbid"), dataclasses.replace(catalog, labs=labs))


@pytest.mark.parametrize("graded", ["as_graded", "measured_only"])
def test_a_faked_harness_scores_nothing_and_the_reference_everything(graded, request):
    rows, details = request.getfixturevalue(graded)
    assert (rows["ada"].score, rows["ada"].status) == (rows["ada"].max_score, "graded") and rows["ada"].score > 0, \
        details["ada"]
    for student in ("fake_in_cell", "fake_beside"):
        scored = {t["grade_id"]: t["score"] for t in details[student]["tests"]}
        assert sorted(scored) == FAKED and set(scored.values()) == {0.0}, (student, details[student]["tests"])


def test_with_nothing_forbidden_the_kernels_byte_count_is_what_catches_the_fakes(measured_only):
    _, details = measured_only
    for student in ("fake_in_cell", "fake_beside"):
        for test in details[student]["tests"]:
            assert "the kernel counted" in test["message"], (student, test)
