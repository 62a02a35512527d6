"""The grading engine's parts, without sandboxes: the wire format, the forbidden-API scan, the
structure repair, and how a lab is read from its source notebook."""
import copy
import io
import json
import struct

import nbformat
import pytest
import torch

from autograder.catalog import Catalog, repo_root
from autograder.course.labspec import LabSpec, defined_names
from autograder.grading.forbid import Tripwires, static_uses
from autograder.grading.program import build_program
from autograder.grading.wire import (
    Handle,
    WireError,
    decode,
    encode,
    read_message,
    write_message,
)

ROOT = repo_root()
B01 = Catalog.load().get("b01")
FORBID = list(B01.forbid)


def test_wire_round_trips_tensors_and_plain_data():
    value = {"t": torch.randn(2, 3, dtype=torch.float64), "b": torch.ones(2, dtype=torch.bool),
             "n": (1, 2.5, float("nan"), float("-inf"), None, True, "s", 2**70),
             "empty": torch.zeros(0, 4), "dtype": torch.bfloat16, "nested": [[torch.tensor(3)]]}
    structure, tensors = encode(value)
    buf = io.BytesIO()
    write_message(buf, {"value": structure}, tensors)
    buf.seek(0)
    header, got_tensors = read_message(buf)
    got = decode(header["value"], got_tensors)
    assert torch.equal(got["t"], value["t"]) and got["t"].dtype == torch.float64
    assert torch.equal(got["b"], value["b"]) and got["empty"].shape == (0, 4)
    assert got["n"][0:2] == (1, 2.5) and got["n"][2] != got["n"][2] and got["n"][3] == float("-inf")
    assert got["n"][4:] == (None, True, "s", 2**70) and got["dtype"] is torch.bfloat16
    assert torch.equal(got["nested"][0][0], torch.tensor(3))


def test_wire_refuses_objects_and_malformed_messages():
    class Sneaky:
        def __reduce__(self):
            raise AssertionError("must never be pickled")
    with pytest.raises(WireError, match="cannot be graded"):
        encode(Sneaky())
    structure, _ = encode(Sneaky(), register_handle=lambda obj: 7)
    assert isinstance(decode(structure, {}), Handle)
    for bad in ({"__tensor__": "missing"}, {"__pickle__": "gASV"}, {"__dtype__": "Tensor"}, {"a": 1, "b": 2}):
        with pytest.raises(WireError):
            decode(bad, {})
    huge = io.BytesIO(struct.pack(">Q", 2**40))
    with pytest.raises(WireError, match="exceeds"):
        read_message(huge)
    junk = io.BytesIO()
    head = json.dumps({"ok": True}).encode()
    junk.write(struct.pack(">Q", len(head)) + head + struct.pack(">Q", 5) + b"abcde")
    junk.seek(0)
    with pytest.raises(WireError, match="malformed tensor blob"):
        read_message(junk)
    with pytest.raises(EOFError):
        read_message(io.BytesIO(b""))


@pytest.mark.parametrize("source, expected", [
    ("import torch.nn.functional as F\ny = F.scaled_dot_product_attention(q, k, v)", FORBID[:1]),
    ("import torch\ny = torch.nn.functional.scaled_dot_product_attention(q, k, v)", FORBID[:1]),
    ("from torch.nn.functional import scaled_dot_product_attention as s", FORBID[:1]),
    ("from torch.nn.functional import *", [FORBID[0], FORBID[4]]),   # brings F.softmax too
    ("f = getattr(torch.nn.functional, 'scaled_dot_product_attention')", FORBID[:1]),
    ("from torch import nn\nm = nn.MultiheadAttention(8, 2)", FORBID[1:2]),
    ("from camplib.attention import softmax", FORBID[2:3]),
    ("import camplib.attention as A", FORBID[2:3]),
    ("def scaled_dot_product_attention(q, k, v):\n    '''my own attention'''\n    return q", []),
    ("class MultiHeadAttention(torch.nn.Module):\n    pass", []),
    ("%matplotlib inline\nimport torch", []),
    # an attribute spelled `softmax` could be any of the three softmax entries: all are named
    ("def softmax(x, dim=-1):\n    return x.softmax(dim)", FORBID[3:6]),
    ("import torch\ndef softmax(x, dim=-1):\n    return torch.softmax(x, dim)", FORBID[3:6]),
    ("def softmax(x, dim=-1):\n    e = (x - x.amax(dim, keepdim=True)).exp()\n    return e / e.sum(dim, keepdim=True)", []),
])
def test_static_scan_resolves_aliases_and_spellings(source, expected):
    assert static_uses(source, FORBID) == expected


def test_tripwires_record_calls_of_forbidden_functions_and_classes():
    import torch.nn.functional as F
    original_sdpa, original_mha = F.scaled_dot_product_attention, torch.nn.MultiheadAttention
    original_method = torch.Tensor.softmax
    try:
        wires = Tripwires(FORBID[:2] + ["torch.Tensor.softmax"])
        torch.randn(3).softmax(0)
        assert wires.hits == {"torch.Tensor.softmax"}
        wires.reset()
        q = torch.randn(1, 2, 3)
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        assert wires.hits == {FORBID[0]}
        wires.reset()
        torch.nn.MultiheadAttention(4, 2)
        assert wires.hits == {FORBID[1]}
    finally:
        F.scaled_dot_product_attention, torch.nn.MultiheadAttention = original_sdpa, original_mha
        torch.Tensor.softmax = original_method


def test_tripwires_arm_whole_libraries_without_breaking_them():
    import tokenizers
    before = {name: getattr(tokenizers, name) for name in dir(tokenizers)}
    try:
        wires = Tripwires(["tokenizers"])   # holds enums with members, which cannot be subclassed
        assert wires.hits == set()
        assert list(tokenizers.SplitDelimiterBehavior)  # enums left usable
    finally:
        for name, obj in before.items():
            setattr(tokenizers, name, obj)


def test_lab_spec_reads_tests_names_and_setup_from_the_source():
    spec = LabSpec.from_notebook(B01.source_path(ROOT))
    assert [t.grade_id for t in spec.tests] == ["test_softmax", "test_masks", "test_sdpa", "test_mha"]
    assert spec.max_score == 12
    assert spec.student_names == ["softmax", "causal_mask", "padding_mask", "scaled_dot_product_attention",
                                  "MultiHeadAttention"]
    assert all("BEGIN HIDDEN TESTS" in t.source and "HIDDEN" not in t.visible_source for t in spec.tests)
    assert "n_hidden_cases" in spec.parameters and any("import torch" in s for s in spec.setup)
    assert defined_names("def f(): pass\nclass C: pass\nx = 1\ny: int = 2\nif True:\n    z = 3") == ["f", "C", "x", "y"]


def test_structure_repair_runs_solutions_once_and_never_runs_tests():
    spec = LabSpec.from_notebook(B01.source_path(ROOT))
    released = nbformat.read(B01.release_path(ROOT), as_version=4)
    program = build_program(spec, released)
    assert program.notes == []
    sources = [cell.source for cell in program.cells]
    assert not any("### BEGIN HIDDEN TESTS" in s or "check_close(" in s for s in sources)
    assert not any("skip-grading" in c.metadata.get("tags", []) and c.source in sources for c in released.cells)
    nb = copy.deepcopy(released)
    test_cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_mha")
    test_cell.metadata = {}  # stripped test cell: recognised by its content, not run
    program = build_program(spec, nb)
    assert not any(cell.source.strip() == test_cell.source.strip() for cell in program.cells)
    assert any("looks like a test cell" in n for n in program.notes)
