"""Forbidden APIs by another name, untrusted reports, hidden files and hostile answers: one
attacker per class, graded in one class next to honest students, each with its exact outcome.

Every attacker is otherwise the reference solution, so the score says exactly what the attack
cost. b01 forbids torch's attention and softmax (labs.toml); its tests are test_softmax (2),
test_masks (2), test_sdpa (4, uses the student's softmax) and test_mha (4, uses their
attention). Honest students whose own names look like forbidden ones must score full marks.
"""

import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.reference import (
    solution_cells,
    student_notebook,
    write_submission,
)
from autograder.grading.grade import GradeOptions, grade
from autograder.isolation.sandbox import namespaces_available
from tests.support import assert_b01_loses_exactly, saved_results

pytestmark = pytest.mark.slow

ROOT = repo_root()
LAB = "b01"
SEED = 1234
REF = solution_cells(LAB)
ALL = ["test_masks", "test_mha", "test_sdpa", "test_softmax"]


def _with(cell, old, new):
    assert old in REF[cell], old
    return REF[cell].replace(old, new, 1)


# attention through a private name of torch's own function; static: sdpa and mha (which uses it)
PRIVATE_ALIAS = _with("sdpa", "return softmax(scores, dim=-1) @ v",
                      "return torch._C._nn.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask) "
                      "if not is_causal else softmax(scores, dim=-1) @ v")
# softmax through the aten operator: every test built on softmax
ATEN_OP = '''
def softmax(x, dim=-1):
    return torch.ops.aten._safe_softmax.default(x, dim)
'''
# a Tensor method laundered through an own class that defines `softmax`: the static scan lets
# the attribute pass as the student's own, the runtime observer sees aten._softmax
LAUNDERED = REF["mha"].replace(
    "y = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)",
    "s = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)\n"
    "        if is_causal:\n"
    "            attn_mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()\n"
    "        if attn_mask is not None:\n"
    "            s = s.masked_fill(~attn_mask, float('-inf'))\n"
    "        y = s.softmax(-1) @ v") + "\n\nclass _Decoy:\n    def softmax(self):\n        return None\n"
# a computed name (any torch entry; a stray cell: every test), module replacement, reaching past
# wrappers, hidden code: every test
DYNAMIC_NAME = "import torch\n_sm = getattr(torch, 'soft' + 'max')\ndef softmax(x, dim=-1):\n    return _sm(x, dim)\n"
RELOAD = "import importlib, camplib.attention\nimportlib.reload(camplib.attention)\n"
SYS_MODULES = "import sys\n_f = sys.modules['torch.nn.functional'].scaled_dot_product_attention\n"
GC_ORIGINAL = "import gc\n_orig = [o for o in gc.get_objects() if getattr(o, '__name__', '') == 'softmax']\n"
UNWRAP = "import torch.nn.functional as F\n_orig = F.scaled_dot_product_attention.__wrapped__\n"
SHELL = "!python -c 'import torch'\n"
# switching the runtime observer off from the inside (then any laundered call would pass)
OBSERVER_OFF = "_a = __import__('autograder')\n_a.grading.observe.called_by_student = lambda *a, **k: False\n"
RUN_MAGIC = "%run helpers.py\n"
AUTOMAGIC = "run helpers.py\n"
HELPER_PY = ("import torch.nn.functional as F\n\n"
             "def attention(q, k, v, attn_mask=None, is_causal=False):\n"
             "    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)\n")
# wire attacks: a malformed frame written straight onto the protocol pipe from causal_mask
RAW_FRAME = '''
import os as _os, struct as _struct
def _protocol_fds():
    for fd in range(3, 64):
        try:
            if _os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:") and _os.get_blocking(fd) is not None:
                yield fd
        except OSError:
            pass
def causal_mask(L, S=None, device=None):
    for fd in _protocol_fds():
        try:
            _os.write(fd, FRAME)
        except OSError:
            pass
    _os._exit(0)
'''
LYING_LENGTH = REF["masks"] + "\nFRAME = __import__('struct').pack('>Q', 2**40)\n" + RAW_FRAME
DEEP_JSON = REF["masks"] + ("\nFRAME = __import__('struct').pack('>Q', 200000) + b'[' * 200000 + "
                            "__import__('struct').pack('>Q', 0)\n") + RAW_FRAME
# wrong only on inputs the visible tests never use (float64, not 2-D): found by hidden cases
HIDDEN_ONLY_BUG = REF["softmax"].replace("def softmax(", "def _softmax(", 1) + '''

def softmax(x, dim=-1):
    y = _softmax(x, dim)
    return y * 1.01 if x.dtype == torch.float64 and x.dim() != 2 else y
'''
# honest students whose own names read like forbidden ones
HONEST_NAMES_MHA = REF["mha"].replace(
    "y = scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)",
    "y = self.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)") + '''

    def scaled_dot_product_attention(self, q, k, v, attn_mask=None, is_causal=False):
        return self.softmax_attention(q, k, v, attn_mask, is_causal)

    def softmax_attention(self, q, k, v, attn_mask, is_causal):
        scaled_dot_product_attention = globals()["scaled_dot_product_attention"]   # a variable of that name
        return scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
'''
HONEST_NAMES_SOFTMAX = REF["softmax"] + '''

class Normalizer:
    """Holds their own softmax as an attribute: self.softmax is theirs."""
    def __init__(self):
        self.softmax = softmax

    def __call__(self, x):
        return self.softmax(x, dim=-1)


import mathutil
_normalize = Normalizer()
assert torch.allclose(_normalize(torch.zeros(3)), mathutil.softmax(torch.zeros(3)))
'''
HONEST_PY = ("import torch\n\ndef softmax(x, dim=-1):\n    e = (x - x.amax(dim, keepdim=True)).exp()\n"
             "    return e / e.sum(dim, keepdim=True)\n")


def _stray(nb, after, source):
    import nbformat
    i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == after)
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
    return nb


EXPECTED_FAILED = {   # student -> tests that must fail (every other test passes)
    "ada": [], "honest_names": [],
    "private_alias": ["test_mha", "test_sdpa"],
    "aten_op": ["test_mha", "test_sdpa", "test_softmax"],
    "laundered_method": ["test_mha"],
    "dynamic_name": ALL, "reload": ALL, "sys_modules": ALL, "gc_original": ALL, "unwrap": ALL,
    "shell_escape": ALL, "observer_off": ALL, "run_magic": ALL, "automagic": [], "py_file": ALL, "deep_py_file": ALL,
    "compiled_module": ALL,
    "lying_length": ["test_masks"], "deep_json": ["test_masks"],
    "hidden_only_bug": ["test_mha", "test_sdpa", "test_softmax"],
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forbidden")
    subs, out = tmp / "submissions", tmp / "workspace"
    nbs = {
        "ada": student_notebook(LAB),
        "honest_names": _stray(student_notebook(LAB, {"softmax": HONEST_NAMES_SOFTMAX, "mha": HONEST_NAMES_MHA}),
                               "softmax", "%matplotlib inline\n%time _ = softmax(torch.zeros(2))\n"),
        "private_alias": student_notebook(LAB, {"sdpa": PRIVATE_ALIAS}),
        "aten_op": student_notebook(LAB, {"softmax": ATEN_OP}),
        "laundered_method": student_notebook(LAB, {"mha": LAUNDERED}),
        "dynamic_name": _stray(student_notebook(LAB), "mha", DYNAMIC_NAME),
        "reload": _stray(student_notebook(LAB), "softmax", RELOAD),
        "sys_modules": _stray(student_notebook(LAB), "softmax", SYS_MODULES),
        "gc_original": _stray(student_notebook(LAB), "softmax", GC_ORIGINAL),
        "unwrap": _stray(student_notebook(LAB), "softmax", UNWRAP),
        "shell_escape": _stray(student_notebook(LAB), "softmax", SHELL),
        "observer_off": _stray(student_notebook(LAB, {"mha": LAUNDERED}), "softmax", OBSERVER_OFF),
        "run_magic": _stray(student_notebook(LAB), "softmax", RUN_MAGIC),
        "automagic": _stray(student_notebook(LAB), "softmax", AUTOMAGIC),
        "py_file": student_notebook(LAB),
        "deep_py_file": student_notebook(LAB),
        "compiled_module": student_notebook(LAB),
        "lying_length": student_notebook(LAB, {"masks": LYING_LENGTH}),
        "deep_json": student_notebook(LAB, {"masks": DEEP_JSON}),
        "hidden_only_bug": student_notebook(LAB, {"softmax": HIDDEN_ONLY_BUG}),
    }
    for student, nb in nbs.items():
        write_submission(subs, student, LAB, nb)
    lab_dir = lambda s: subs / s / Catalog.load().get(LAB).name   # noqa: E731
    (lab_dir("honest_names") / "mathutil.py").write_text(HONEST_PY)
    (lab_dir("py_file") / "helpers.py").write_text(HELPER_PY)
    # what `run helpers.py` would run: a softmax that is wrong (and allowed), so running it shows
    (lab_dir("automagic") / "helpers.py").write_text("def softmax(x, dim=-1):\n    return x * 0\n")
    (lab_dir("deep_py_file") / "pkg" / "sub").mkdir(parents=True)
    (lab_dir("deep_py_file") / "pkg" / "sub" / "impl.py").write_text(HELPER_PY)
    (lab_dir("compiled_module") / "fastmath.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    isolation = "namespace" if namespaces_available() else "none"
    rows = grade(subs, Catalog.load(), ROOT, out, None,
                 GradeOptions(jobs=2, cell_timeout=20, isolation=isolation, seed=SEED))
    details = saved_results(out, "b01_attention")
    return {r.student: r for r in rows}, details


def _message(details, student, test):
    return next(t["message"] for t in details[student]["tests"] if t["grade_id"] == test)


@pytest.mark.parametrize("student", sorted(EXPECTED_FAILED))
def test_each_attack_costs_exactly_its_tests(graded, student):
    rows, details = graded
    assert_b01_loses_exactly(rows, details, student, EXPECTED_FAILED[student])


@pytest.mark.parametrize("student, fragment", [
    ("private_alias", "torch.nn.functional.scaled_dot_product_attention, which this lab forbids"),
    ("aten_op", "torch.softmax"),
    ("laundered_method", "your code called torch.Tensor.softmax"),
    ("dynamic_name", "torch.softmax"),
    ("reload", "importlib.reload"),
    ("sys_modules", "sys.modules"),
    ("gc_original", "gc.get_objects"),
    ("unwrap", "__wrapped__"),
    ("shell_escape", "shell command"),
    ("observer_off", "autograder.grading.observe.called_by_student"),
    ("run_magic", "%run"),
    ("py_file", "helpers.py uses torch.nn.functional.scaled_dot_product_attention"),
    ("deep_py_file", "pkg/sub/impl.py uses"),
    ("compiled_module", "cannot read it"),
])
def test_the_reason_is_named(graded, student, fragment):
    _, details = graded
    failed = EXPECTED_FAILED[student]
    assert fragment in _message(details, student, failed[-1]), _message(details, student, failed[-1])


@pytest.mark.parametrize("student", ["lying_length", "deep_json"])
def test_a_malformed_answer_is_that_students_failed_test(graded, student):
    rows, details = graded
    assert rows[student].status == "graded" and not details[student]["retry"]
    assert "malformed" in _message(details, student, "test_masks") or "exceeds" in _message(details, student, "test_masks")


def test_hidden_cases_use_the_runs_seed_and_say_so(graded):
    _, details = graded
    assert {d["seed"] for d in details.values()} == {SEED}
    message = _message(details, "hidden_only_bug", "test_softmax")
    assert f"seed {SEED}" in message and "hidden case" in message and "first at index" in message


def test_a_cell_that_cannot_be_parsed_is_not_run(graded):
    """`run helpers.py`: IPython's automagic could run helpers.py (which replaces softmax with a
    wrong one); the grader does not run a cell it cannot parse, says so, and grades the rest."""
    rows, details = graded
    assert rows["automagic"].score == 12
    assert any("cannot be parsed" in e and "did not run it" in e for e in details["automagic"]["cell_errors"]), \
        details["automagic"]["cell_errors"]
