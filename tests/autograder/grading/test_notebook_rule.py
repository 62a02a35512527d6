"""One rule for what a valid notebook is (autograder.grading.uploads.notebooks), shared by the
upload check, `camp check` and the grader: each variant an honest student's Jupyter may save
(a byte-order mark, CRLF line ends, nbformat v3, older v4 minor versions) is accepted by all
three, and a broken one is rejected by all three with the same reason."""
import json

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.labspec import LabSpec
from autograder.course.reference import student_notebook
from autograder.course.selfcheck import read_submission
from autograder.grading.engine import grade_submission
from autograder.grading.uploads import collect

ROOT = repo_root()
LAB = Catalog.load().get("b01")
SPEC = LabSpec.from_notebook(LAB.source_path(ROOT))


def _reference() -> nbformat.NotebookNode:
    """b01's reference answers plus a shell escape, so the grader decides every test from the
    static scan alone and never needs a sandbox: a notebook it read is one it graded."""
    nb = student_notebook("b01")
    nb.cells.append(nbformat.v4.new_code_cell("!ls"))
    return nb


def _v4(minor: int) -> bytes:
    nb = _reference()
    nb.nbformat_minor = minor
    if minor < 5:
        for cell in nb.cells:
            cell.pop("id", None)
    return nbformat.writes(nb, version=4).encode()


def _crlf() -> bytes:
    """Windows line ends in the file and in every cell's source."""
    nb = _reference()
    for cell in nb.cells:
        cell.source = cell.source.replace("\n", "\r\n")
    return nbformat.writes(nb, version=4).replace("\n", "\r\n").encode()


def _v3() -> bytes:
    return nbformat.writes(nbformat.convert(_reference(), 3), version=3).encode()


HONEST = {
    "bom": lambda: b"\xef\xbb\xbf" + _v4(5),
    "crlf": lambda: _crlf(),
    "v4.0": lambda: _v4(0),
    "v4.2": lambda: _v4(2),
    "v4.4": lambda: _v4(4),
    "v3": _v3,
}
BROKEN = {   # variant -> what every reader must say
    "v2": (lambda: json.dumps({"nbformat": 2, "nbformat_minor": 0, "worksheets": []}).encode(), "has no list of cells"),
    "cell_without_type": (lambda: json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {},
                                              "cells": [{"source": "x = 1", "metadata": {}}]}).encode(),
                          "not a valid notebook"),
    "bom_then_garbage": (lambda: b"\xef\xbb\xbf{not json", "not valid JSON"),
    "latin1": (lambda: '{"cells": [], "x": "caf\xe9"}'.encode("latin-1"), "not UTF-8"),
}


def _three_readers(tmp_path, data: bytes):
    """(upload rejection or None, camp check's problem or None, the grader's result)."""
    subs = tmp_path / "subs"
    path = subs / "ada" / LAB.name / LAB.notebook
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    found, rejected = collect(subs, tmp_path / "scratch")
    upload = rejected[0].reason if rejected else None
    _, problem = read_submission(path, Catalog.load())
    result = grade_submission(SPEC, path, "ada", "b01", sandbox=None, forbid=list(LAB.forbid), seed=1)
    return upload, problem, result


@pytest.mark.parametrize("variant", sorted(HONEST))
def test_every_reader_accepts_what_jupyter_saves(tmp_path, variant):
    upload, problem, result = _three_readers(tmp_path, HONEST[variant]())
    assert upload is None and problem is None, (upload, problem)
    assert result.status == "graded", result.message
    assert all("shell command" in t.message for t in result.tests), [t.message for t in result.tests]


@pytest.mark.parametrize("variant", sorted(BROKEN))
def test_every_reader_rejects_a_broken_notebook_with_the_same_reason(tmp_path, variant):
    make, expected = BROKEN[variant]
    upload, problem, result = _three_readers(tmp_path, make())
    assert result.status == "error"
    assert upload is not None and expected in upload, upload
    assert upload == problem == result.message, (upload, problem, result.message)


def test_v3_and_crlf_cells_read_as_the_same_code():
    from autograder.grading.uploads.notebooks import parse_notebook
    v4 = parse_notebook(_v4(5))
    for data in (_v3(), HONEST["crlf"]()):
        other = parse_notebook(data)
        assert [c.source for c in other.cells if c.cell_type == "code"] == \
            [c.source for c in v4.cells if c.cell_type == "code"]
