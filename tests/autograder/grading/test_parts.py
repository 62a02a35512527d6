"""The grading engine's parts, without sandboxes: the wire format, the forbidden-API scan, the
structure repair, and how a lab is read from its source notebook."""
import copy
import io
import json
import os
import struct
from pathlib import Path

import nbformat
import pytest
import torch

from autograder.catalog import Catalog, repo_root
from autograder.checks import case, check_close
from autograder.course.labspec import LabSpec, defined_names
from autograder.grading.entries import alias_of
from autograder.grading.forbid import scan, static_uses
from autograder.grading.tripwires import Tripwires
from autograder.grading.observe import canary_plan, ops_for
from autograder.grading.program import build_program
from autograder.grading.static_check import banned_tests
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
    # private aliases and operator namespaces of the same functions
    ("import torch\ny = torch._C._nn.scaled_dot_product_attention(q, k, v)", FORBID[:1]),
    ("import torch\ny = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]", FORBID[:1]),
    ("import torch\nfrom torch import ops\ny = ops.aten._safe_softmax.default(x, -1)", FORBID[3:6]),
    ("import torch\naten = torch.ops.aten\ny = aten._softmax(x, -1, False)", FORBID[3:6]),
    ("import torch\ny = torch._C._VariableFunctions.softmax(x, -1)", FORBID[3:6]),
    ("import torch\nm = torch.nn.Softmax(dim=-1)", FORBID[3:6]),
    ("from torch._refs import softmax as s", FORBID[3:6]),
    ("import torch\nt = torch.Tensor.softmax(x, -1)", FORBID[3:6]),
    ("import operator\nf = operator.methodcaller('softmax', -1)", FORBID[3:6]),
    ("exec('import torch; y = torch.softmax(x, -1)')", FORBID[3:6]),
    # a name computed at run time could be any forbidden entry of that package
    ("import torch\nf = getattr(torch, 'soft' + 'max')", FORBID[3:6]),     # folded: the literal 'softmax'
    ("import torch\nf = getattr(torch, name)", [e for e in FORBID if e.startswith("torch")]),
    ("import torch.nn.functional as F\nf = vars(F)[name]", [e for e in FORBID if e.startswith("torch")]),
    ("import torch.nn.functional as F\nf = F.__dict__[name]", [e for e in FORBID if e.startswith("torch")]),
    ("import importlib\nt = importlib.import_module('camplib')\nf = getattr(t, name)", FORBID[2:3]),
    ("%timeit torch.softmax(x, -1)", FORBID[3:6]),
    # an honest student's own names are never forbidden calls
    ("scaled_dot_product_attention = None\nprint(scaled_dot_product_attention)", []),
    ("class Block(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
     "        self.softmax = MySoftmax()\n    def forward(self, x):\n        return self.softmax(x)", []),
    ("class A:\n    def scaled_dot_product_attention(self, q, k, v):\n        return q\n"
     "y = A().scaled_dot_product_attention(q, k, v)", []),
    ("import torch\nnames = ['softmax']\nprint('softmax', x.log_softmax(-1), self.softmax_scale)", []),
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


@pytest.mark.parametrize("name, entry, expected", [
    ("_softmax", "torch.softmax", True), ("_safe_softmax", "torch.softmax", True),
    ("special_softmax", "torch.softmax", True), ("Softmax", "torch.softmax", True),
    ("_softmax_backward_data", "torch.softmax", True), ("log_softmax", "torch.softmax", False),
    ("_log_softmax", "torch.softmax", False), ("softmax_scale", "torch.softmax", False),
    ("_scaled_dot_product_flash_attention", FORBID[0], True), ("_scaled_dot_product_attention_math", FORBID[0], True),
    ("scaled_dot_product", FORBID[0], False), ("native_layer_norm", "torch.nn.functional.layer_norm", True),
    ("_fused_adamw_", "torch.optim.AdamW", True), ("_fused_adam_", "torch.optim.AdamW", False),
    ("MultiHeadAttention", "torch.nn.MultiheadAttention", False),
])
def test_aliases_are_the_same_function_under_another_name(name, entry, expected):
    assert alias_of(name, entry) is expected


@pytest.mark.parametrize("source, fragment", [
    ("import importlib, camplib\nimportlib.reload(camplib)", "importlib.reload"),
    ("import sys\nsys.modules['camplib.attention'] = object()", "sys.modules"),
    ("import camplib.dist\ncamplib.dist.launch = print", "assigns to camplib.dist.launch"),
    ("import torch.nn.functional as F\nsetattr(F, 'softmax', print)", "replaces torch.nn.functional.softmax"),
    ("import torch.nn.functional as F\nF.softmax = print", "assigns to torch.nn.functional.softmax"),
    ("import torch.nn.functional as F\nf = F.scaled_dot_product_attention.__wrapped__", "__wrapped__"),
    ("f = g.__closure__[0].cell_contents", "__closure__"),
    ("import gc\nx = gc.get_referents(f)", "gc.get_referents"),
    ("from torch.utils._python_dispatch import _disable_current_modes", "machinery"),
    ("import torch\ntorch._C._unset_dispatch_mode(0)", "machinery"),
    ("import autograder.grading.observe", "machinery"),
    ("a = __import__('autograder')\na.grading.observe.called_by_student = print", "machinery"),
    ("a = __import__('autograder')\nm = getattr(a, 'gra' + 'ding')", "machinery"),
    ("a = __import__('autograder')\nm = getattr(a, name)", "computed names"),
    ("import torch\ntorch.tril = lambda x: x", "assigns to torch.tril"),
    ("import numpy\nnumpy.testing.assert_allclose = print", "assigns to numpy.testing.assert_allclose"),

    ("exec(code)", "exec()"),
    ("m = __import__(name)", "__import__()"),
    ("!python helper.py", "shell command"),
    ("x = !ls", "shell command"),
    ("%run helper.py", "%run"),
    ("%%bash\npython helper.py\n", "%bash"),
    ("%%writefile helper.py\nimport torch\n", "%writefile"),
    ("get_ipython().run_cell('import torch')", "get_ipython"),
    ("ip = get_ipython()", "get_ipython"),
    ("run helper.py", "cannot be parsed"),     # automagic: IPython would run it, Python cannot parse it
    ("def f(:\n    pass", "cannot be parsed"),
    ("import types\nf = types.FunctionType(code, {})", "types.FunctionType"),
])
def test_escapes_from_the_scan_are_findings(source, fragment):
    hits, findings = scan(source, FORBID)
    assert any(fragment in f for f in findings), (hits, findings)


@pytest.mark.parametrize("source", [
    "%matplotlib inline\nimport torch",
    "%time y = softmax(x)",
    "import torch\ntorch.backends.cudnn.deterministic = True\nimport matplotlib.pyplot as plt\nplt.rcParams['figure.dpi'] = 80",
    "import gc\ngc.collect()",
    "f?",
])
def test_harmless_code_is_not_a_finding(source):
    assert scan(source, FORBID) == ([], [])


def _cells(nb):
    spec = LabSpec.from_notebook(B01.source_path(ROOT))
    return spec, build_program(spec, nb).cells


def test_a_forbidden_call_costs_its_exercise_and_every_exercise_built_on_it(tmp_path):
    from autograder.course.reference import student_notebook
    spec, cells = _cells(student_notebook("b01", {"softmax": "def softmax(x, dim=-1):\n    return x.softmax(dim)\n"}))
    banned = banned_tests(spec, cells, FORBID, tmp_path)
    assert sorted(banned) == ["test_mha", "test_sdpa", "test_softmax"]
    assert "torch.Tensor.softmax" in banned["test_softmax"] and "forbids" in banned["test_softmax"]
    spec, cells = _cells(student_notebook("b01"))
    assert banned_tests(spec, cells, FORBID, tmp_path) == {}


def test_every_python_file_is_scanned_and_unreadable_modules_are_findings(tmp_path):
    from autograder.course.reference import student_notebook
    spec, cells = _cells(student_notebook("b01"))
    (tmp_path / "mine.py").write_text("def softmax(x, dim=-1):\n    return (x - x.amax(dim, keepdim=True)).exp()\n")
    assert banned_tests(spec, cells, FORBID, tmp_path) == {}           # an honest helper module
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "deep.py").write_text("import torch\nf = torch.ops.aten._softmax\n")
    banned = banned_tests(spec, cells, FORBID, tmp_path)
    assert set(banned) == {t.grade_id for t in spec.tests} and "a/b/deep.py uses torch.softmax" in banned["test_mha"]
    (tmp_path / "a" / "b" / "deep.py").unlink()
    (tmp_path / "fast.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    banned = banned_tests(spec, cells, FORBID, tmp_path)
    assert set(banned) == {t.grade_id for t in spec.tests} and "cannot read it" in banned["test_softmax"]
    (tmp_path / "fast.cpython-312-x86_64-linux-gnu.so").unlink()
    (tmp_path / "broken.py").write_text("def f(:\n")
    assert "broken.py cannot be parsed" in banned_tests(spec, cells, FORBID, tmp_path)["test_masks"]


@pytest.mark.parametrize("source", ["run helpers.py\n", "def softmax(x, dim=-1):\n    return x.softmax(dim\n"])
def test_a_cell_that_cannot_be_parsed_is_not_run_and_costs_no_other_exercise(tmp_path, source):
    """An honest student's unfinished exercise (a syntax error) or an automagic line IPython might
    run: the cell is skipped, never scanned into a ban on every test."""
    from autograder.course.reference import student_notebook
    from autograder.grading.forbid import unparsable_cell
    spec, cells = _cells(student_notebook("b01", {"masks": source}))
    assert banned_tests(spec, cells, FORBID, tmp_path) == {}
    assert unparsable_cell(source).startswith("cannot be parsed") and "did not run it" in unparsable_cell(source)
    assert unparsable_cell("%time x = 1\n!ls\n") is None


_OBSERVER_CHILD = r"""
import json, os, sys, threading
from concurrent.futures import ThreadPoolExecutor
import torch
from autograder.grading.observe import arm, canary_plan
forbid = json.loads(sys.argv[1])
fd = int(sys.argv[2])
x, q = torch.randn(2, 5, dtype=torch.float64), torch.randn(1, 2, 3, 4)
honest = {"softmax": (x - x.amax(-1, keepdim=True)).exp() / (x - x.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True),
          "sdpa": torch.nn.functional.scaled_dot_product_attention(q, q, q)}
expected = {"sdpa_grad": None}
qg = q.clone().requires_grad_()
torch.nn.functional.scaled_dot_product_attention(qg, qg, qg).sum().backward()
expected["sdpa_grad"] = qg.grad
obs = arm(forbid, fd)                          # from here on, every call counts
import warnings
warnings.simplefilter("error")                 # e.g. autograd's "no autograd kernel registered"
def mark(tag):
    os.write(1, (tag + "\n").encode())
    os.read(0, 1)                              # the test reads the channel, then lets us go on
mark("armed")
qg = q.clone().requires_grad_()
out = torch.nn.functional.scaled_dot_product_attention(qg, qg, qg)
out.sum().backward()
assert torch.equal(out, honest["sdpa"]) and torch.equal(qg.grad, expected["sdpa_grad"])   # bit for bit
mark("sdpa")
torch.einsum("ij,kj->ik", x, x); (x.exp() / x.exp().sum(-1, keepdim=True))
mark("honest")
t = threading.Thread(target=lambda: torch.ops.aten._safe_softmax.default(x, -1)); t.start(); t.join()
mark("thread")
with ThreadPoolExecutor(2) as pool:
    pool.submit(torch._C._nn.scaled_dot_product_attention, q, q, q).result()
mark("pool")
pid = os.fork()
if pid == 0:
    torch.ops.aten._softmax.default(x, -1, False)
    os._exit(0)
os.waitpid(pid, 0)
mark("fork")
lib = torch.library.Library("camp_test_mine", "DEF")
lib.define("attend(Tensor q) -> Tensor")
lib.impl("attend", lambda t: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(t, t, t)[0], "CPU")
torch.ops.camp_test_mine.attend(q)
mark("custom_op")
cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
torch.ops.aten._softmax.default.redispatch(cpu, x, -1, False)
mark("redispatch")
obs.canary(list(canary_plan(tuple(forbid))), seed=3)
mark("canary")
"""


def test_the_runtime_observer_reports_every_thread_fork_and_operator_on_the_grader_s_channel():
    """Armed in a process of its own (it changes that process's dispatcher for good): torch's own
    results bit for bit, honest code reports nothing, and every route to a forbidden operator
    (another thread, a thread pool, a forked child, an operator registered with torch.library,
    a redispatch straight to the CPU kernel) reaches the channel only the grader reads."""
    import json
    import subprocess
    import sys

    from autograder.grading.observe import read_reports, report_channel
    grader, student = report_channel()
    grader.setblocking(False)
    proc = subprocess.Popen([sys.executable, "-c", _OBSERVER_CHILD, json.dumps(FORBID), str(student.fileno())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(student.fileno(),), cwd=ROOT)
    student.close()
    seen = {}
    try:
        for line in proc.stdout:
            seen[line.decode().strip()] = read_reports(grader, FORBID)
            proc.stdin.write(b"x")
            proc.stdin.flush()
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    softmax, sdpa = set(FORBID[3:6]), {FORBID[0]}
    assert seen["armed"] == (set(), True)
    assert seen["sdpa"] == (sdpa, True)
    assert seen["honest"] == (set(), True)
    assert seen["thread"] == (softmax, True)
    assert seen["pool"] == (sdpa, True)
    assert seen["fork"] == (softmax, True)
    assert seen["custom_op"] == (sdpa, True)
    assert seen["redispatch"] == (softmax, True)
    assert seen["canary"] == ({e for e, _, _ in canary_plan(tuple(FORBID))}, True)


def test_the_channel_tells_tampering_from_reports():
    from autograder.grading.observe import Reporter, read_reports, report_channel
    grader, student = report_channel()
    grader.setblocking(False)
    report = Reporter(student.fileno())
    report(("torch.softmax",))
    assert read_reports(grader, FORBID) == ({"torch.softmax"}, True)
    student.send(b"not an entry")                    # anything but a report: tampering
    assert read_reports(grader, FORBID) == (set(), False)
    report(("torch.softmax",))
    report.sock.close()                              # the student's end closed: tampering, and
    assert read_reports(grader, FORBID) == ({"torch.softmax"}, False)   # what was sent stays sent


def test_tripwires_report_every_call_whoever_calls():
    """No exemption by frame: a forbidden function called from the course's own code (here a
    compiled snippet that claims to be camplib) is reported like the student's own call."""
    import torch.nn.functional as F

    import camplib
    saved = F.scaled_dot_product_attention
    try:
        wires = Tripwires([FORBID[0]])
        course_file = str(Path(camplib.__file__).parent / "fake.py")
        q = torch.randn(1, 2, 3)
        exec(compile("F.scaled_dot_product_attention(q, q, q)", course_file, "exec"), {"F": F, "q": q})
        assert wires.hits == {FORBID[0]}
    finally:
        F.scaled_dot_product_attention = saved


def test_canaries_are_planned_in_the_trusted_process_without_arming_it():
    plan = list(canary_plan(tuple(FORBID)))
    assert {e for e, _, _ in plan} == {FORBID[0], FORBID[1], *FORBID[3:6]}    # camplib.attention is a module
    assert {w for _, w, _ in plan} == {"name", "dispatch"}
    x = torch.randn(3)
    assert torch.equal(torch.softmax(x, 0), torch.ops.aten._softmax.default(x, 0, False))   # nothing armed here


def test_wire_bounds_what_a_hostile_frame_can_cost():
    from autograder.grading import wire

    class Trickle(io.BytesIO):
        asked: list = []

        def read(self, n=-1):
            self.asked.append(n)
            return super().read(n)
    lying = Trickle(struct.pack(">Q", 2) + b"{}" + struct.pack(">Q", 200 * 2**20) + b"x" * 10)
    with pytest.raises(EOFError):
        read_message(lying)                         # claims 200 MiB, sends 10 bytes
    assert max(lying.asked) <= wire.CHUNK_BYTES     # never a buffer the claim sized
    over = io.BytesIO(struct.pack(">Q", 2) + b"{}" + struct.pack(">Q", wire.MAX_BLOB_BYTES + 1))
    with pytest.raises(WireError, match="exceeds"):
        read_message(over)
    assert wire.MAX_BLOB_BYTES <= 256 * 2**20
    deep = b"[" * 100000
    with pytest.raises(WireError, match="malformed message header"):
        read_message(io.BytesIO(struct.pack(">Q", len(deep)) + deep + struct.pack(">Q", 0)))
    bad_st = struct.pack("<Q", 60) + b'{"t0": {"dtype": "F32", "shape": [1000000], "data_offsets": [0, 4000000]}}'
    with pytest.raises(WireError, match="malformed tensor blob"):
        read_message(io.BytesIO(struct.pack(">Q", 2) + b"{}" + struct.pack(">Q", len(bad_st)) + bad_st))
    with pytest.raises(WireError):
        decode({"__int__": "9" * 5000}, {})


def test_hidden_case_failures_name_the_case_and_the_first_bad_element():
    x = torch.zeros(2, 3, dtype=torch.float64)
    y = x.clone()
    y[0, 2], y[1, 0] = 1e-3, 5.0
    with pytest.raises(AssertionError) as err:
        with case(3, seed=123, shape=x.shape, dtype=x.dtype, dim=1):
            check_close("softmax(x)", y, x)
    msg = str(err.value)
    assert msg.startswith("hidden case 3 (seed 123, shape (2, 3), float64, dim=1): softmax(x): ")
    assert "max |difference| = 5 at index (1, 0)" in msg and "first at index (0, 2)" in msg
    with pytest.raises(AssertionError, match=r"^hidden case 0: TypeError: boom"):
        with case(0):
            raise TypeError("boom")
    with case(1, seed=1):
        check_close("fine", x, x)                  # a passing case says nothing


def test_the_grader_sets_a_fresh_seed_in_the_trusted_namespace_only():
    from autograder.grading.engine import _trusted_namespace, new_seed
    spec = LabSpec.from_notebook(B01.source_path(ROOT))
    assert _trusted_namespace(spec, 4242)["seed"] == 4242
    assert len({new_seed() for _ in range(5)}) > 1


def test_starting_the_grading_fork_server_leaves_the_callers_environment_alone(monkeypatch):
    """The fork server imports pyplot headless (MPLBACKEND=Agg in its own environment only): a
    caller that later starts Jupyter (the browser test's pytest worker, a notebook) keeps inline
    figures."""
    from autograder.grading.pool import start_fork_server
    monkeypatch.delenv("MPLBACKEND", raising=False)
    start_fork_server([])
    assert "MPLBACKEND" not in os.environ


def test_a_camplib_entry_missing_from_the_sandbox_maps_to_no_operator():
    """A lab's sandbox leaves out the camplib modules it forbids (course_tree), so there such an
    entry does not import; read as a function, camplib.parallel's module `zero` (before it became
    a folder) aliased `aten::zero_` and the reference solutions of b06 and a02 lost their distributed
    tests. camplib entries are the static scan's: the dispatcher layer wires torch's only."""
    assert ops_for(("camplib.not_in_this_sandbox.zero",)) == {}
    assert ops_for(("camplib.attention.softmax", "torch.softmax")) == ops_for(("torch.softmax",))
    assert "zero_" not in ops_for(("camplib.not_in_this_sandbox.zero", "torch.softmax"))


def test_each_sandbox_gets_its_share_of_the_cores_in_threads_at_most_omp_num_threads(monkeypatch):
    from autograder.grading.grade import GradeOptions, _share

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [_share(GradeOptions(jobs=j))["threads"] for j in (1, 2, 3, 16)] == [8, 4, 2, 1]
    for value, expected in [("1", [1, 1]), ("3", [3, 3]), ("64", [8, 4]), ("", [8, 4]), ("two", [8, 4])]:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
        shares = [_share(GradeOptions(jobs=j)) for j in (1, 2)]
        assert [s["threads"] for s in shares] == expected, value
        assert [s["cpus"] for s in shares] == [8.0, 4.0], "the CPU quota stays the share of the cores"


def test_the_collectives_layer_sees_every_dist_collective(tmp_path):
    """wire_collectives reports the torch.distributed collectives a process calls, torch 2.13's
    `*_single` paths (all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single) included,
    and the c10d operators called by their Python names (`torch.ops.c10d.allreduce_`, its
    `.default`, the functional collectives), whose proxies hand out no way past the report; the
    wrapped classes and op namespaces are restored afterwards. (~0.6 s)"""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import Backend, ProcessGroup

    from autograder.grading.collective_ops import OP_COLLECTIVES
    from autograder.grading.observe import collective_name, wire_collectives

    saved = {cls: dict(vars(cls)) for cls in (ProcessGroup, Backend)}
    seen = []
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        wire_collectives(lambda message: seen.append(collective_name(message[0])))
        x = torch.ones(4)
        dist.all_reduce(x)
        dist.broadcast(x, 0)
        dist.all_gather_into_tensor(torch.empty(4), x)
        dist.reduce_scatter_tensor(torch.empty(4), x)
        dist.all_to_all_single(torch.empty(4), x)
        dist.barrier()
        assert seen[:5] == ["allreduce", "broadcast", "_allgather_base", "_reduce_scatter_base", "alltoall_base"], seen
        del seen[:]
        group, op = dist.group.WORLD.boxed(), torch.classes.c10d.ReduceOp()
        torch.ops.c10d.allreduce_([x], group, op, None, False, -1)[1].wait()
        torch.ops.c10d.broadcast_.default([x], group, 0, 0, False, -1)[1].wait()
        functional = torch.ops._c10d_functional   # what funcol.all_reduce calls (its first call costs ~6 s)
        y = functional.wait_tensor(functional.all_reduce(x, "sum", dist.group.WORLD.group_name))
        assert seen == ["allreduce", "broadcast", "_c10d_functional::all_reduce"] and y.tolist() == [1.0] * 4, seen
        for way_past in ("_op", "op", "redispatch", "_overloadpacket", "py_kernels"):
            with pytest.raises(AttributeError, match="not available in the grader's ranks"):
                getattr(torch.ops.c10d.allreduce_.default, way_past)
    finally:
        for cls, attrs in saved.items():
            for name, value in attrs.items():
                if vars(cls).get(name) is not value:
                    setattr(cls, name, value)
        for ns, ops in OP_COLLECTIVES.items():   # the next lookup makes torch's own packet again
            for name in ops:
                vars(getattr(torch.ops, ns)).pop(name, None)
        dist.destroy_process_group()
