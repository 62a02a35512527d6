"""What many test files share: where the repository is, and one way to say "equal within a
tolerance" that names the value compared and its largest difference.

`assert_close` is `autograder.checks.check_close` (the helper every lab's tests use) extended to
the containers tests compare (dicts of parameters, lists of per-rank tensors): a failure names the
entry, e.g. "params[rank 1]['blocks.0.attn.qkv.weight']: max |difference| = 3e-4 at index ...".
"""
from __future__ import annotations

import os
import socket
import warnings
from pathlib import Path

import pytest
import torch

from autograder.checks import check_close

ROOT = Path(__file__).resolve().parent.parent


def assert_close(name: str, actual, expected, *, atol: float | None = None, rtol: float | None = None,
                 check_dtype: bool = True) -> None:
    """Fail unless `actual` equals `expected` within atol + rtol * |expected|, element-wise.

    Tensors, numbers, and dicts / lists / tuples of them (compared key by key, item by item).
    Without atol/rtol the per-dtype defaults of autograder.checks.TOLERANCES apply."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{name}: expected a dict, got {type(actual).__name__}"
        assert sorted(actual) == sorted(expected), \
            f"{name}: keys differ (missing {sorted(set(expected) - set(actual))}, extra {sorted(set(actual) - set(expected))})"
        for key in expected:
            assert_close(f"{name}[{key!r}]", actual[key], expected[key], atol=atol, rtol=rtol, check_dtype=check_dtype)
        return
    if isinstance(expected, (list, tuple)) and not (expected and isinstance(expected[0], (int, float))):
        assert len(actual) == len(expected), f"{name}: {len(actual)} items, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(f"{name}[{i}]", a, e, atol=atol, rtol=rtol, check_dtype=check_dtype)
        return
    if not isinstance(expected, torch.Tensor):
        expected = torch.as_tensor(expected, dtype=torch.float64)
        check_dtype = False
    check_close(name, actual, expected, atol=atol, rtol=rtol, check_dtype=check_dtype)


def saved_results(workspace: Path, lab_name: str) -> dict[str, dict]:
    """student -> the SubmissionResult dict `camp grade` saved in `workspace` for `lab_name`."""
    import json
    return {p.stem: json.loads(p.read_text())["result"] for p in (workspace / "results" / lab_name).glob("*.json")}


def failed_tests(results: dict[str, dict], student: str) -> list[str]:
    """grade_ids of the tests `student` failed (sorted), from `saved_results`."""
    return sorted(t["grade_id"] for t in results[student]["tests"] if t["message"])


B01_POINTS = {"test_softmax": 2, "test_masks": 2, "test_sdpa": 4, "test_mha": 4}


def assert_b01_loses_exactly(rows: dict, results: dict[str, dict], student: str, failed: list[str]) -> None:
    """`student`'s b01 submission failed exactly the tests `failed` and lost exactly their points."""
    assert failed_tests(results, student) == failed, results[student]["tests"]
    assert rows[student].score == sum(B01_POINTS.values()) - sum(B01_POINTS[t] for t in failed)


def not_run(message: str, ci_note: str = "", fail_under_ci: bool = True):
    """A check this machine cannot run says so loudly: under CI (which must run it) a failure,
    elsewhere a warning and a skip, each carrying `message` (start it with "... NOT RUN:")."""
    if fail_under_ci and os.environ.get("CI"):
        pytest.fail(message + ci_note)
    warnings.warn(message, UserWarning)
    pytest.skip(message)


def free_port() -> int:
    """A loopback port free right now (the OS picks it), for a server or a process group a test starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
