"""The runtime observer against forbidden kernels run where a per-thread or per-frame observer
cannot see them, graded in one class next to honest students who use threads and einsum.

Every attacker is otherwise the reference solution and reaches b01's forbidden softmax kernel
(`aten::_safe_softmax`, zeros on fully masked rows, like the exercise asks) through names the
static scan reads as the student's own, only inside their `scaled_dot_product_attention`: so
exactly test_sdpa (4) and test_mha (4, built on their attention) must fail. Routes: another
thread, a thread pool, a forked child, a fork process pool, a fresh `python -c` interpreter, an
operator registered with torch.library, course helpers calling the kernel for them
(`autograder.checks.forward_backward`, `camplib.activation_checkpoint.checkpoint`), and the exercise's
name bound to torch's operator itself, so that only the grader's request calls it. A student who closes
the observer's channel loses every test (tampering).
"""

import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.reference import solution_cells, student_notebook, write_submission
from autograder.grading.grade import GradeOptions, grade
from autograder.isolation.sandbox import namespaces_available
from tests.support import assert_b01_loses_exactly, saved_results

pytestmark = pytest.mark.slow

ROOT = repo_root()
LAB = "b01"
REF = solution_cells(LAB)
RETURN = "return softmax(scores, dim=-1) @ v"
SDPA_AND_MHA = ["test_mha", "test_sdpa"]
ALL = ["test_masks", "test_mha", "test_sdpa", "test_softmax"]

# names the scan reads as the student's own attributes; the aten namespace arrives as a default
PRELUDE = '''
import concurrent.futures, functools, multiprocessing, operator, os, subprocess, sys, tempfile, threading
from autograder.checks import forward_backward
from camplib.activation_checkpoint import checkpoint


class _Own:
    def _safe_softmax(self):
        return None

    def softmax(self):
        return None


def _forbidden(ns=torch.ops.aten):
    return ns._safe_softmax.default


def _kernel(scores):
    return _forbidden()(scores, -1)


def _straight_through(scores, value):
    """The forbidden kernel's value forward, the student's own softmax's gradient backward."""
    own = softmax(scores, dim=-1)
    return own + (value.to(own.dtype) - own).detach()

'''


def _attack(body: str, prelude: str = PRELUDE) -> str:
    """The reference sdpa cell whose softmax comes from `body` (code that sets `p`, its lines
    after the first indented for the function's body)."""
    cell = REF["sdpa"].replace(RETURN, body.strip() + "\n    return p @ v")
    assert cell != REF["sdpa"]
    return prelude + cell


THREAD = '''out = []
    worker = threading.Thread(target=lambda: out.append(_kernel(scores)))
    worker.start()
    worker.join()
    p = out[0]'''
THREAD_POOL = '''with concurrent.futures.ThreadPoolExecutor(2) as pool:
        p = pool.submit(_kernel, scores).result()'''
FORK = '''r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, _kernel(scores.detach()).contiguous().numpy().tobytes())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    p = _straight_through(scores, torch.frombuffer(bytearray(data), dtype=scores.dtype).reshape(scores.shape))'''
PROCESS_POOL = '''with multiprocessing.get_context("fork").Pool(1) as pool:
        value = pool.apply(operator.methodcaller("softmax", -1), (scores.detach(),))
    p = _straight_through(scores, torch.nan_to_num(value, nan=0.0))'''
FRESH_PYTHON = '''folder = tempfile.mkdtemp()
    torch.save(scores.detach(), folder + "/in.pt")
    code = "import sys, torch; x = torch.load(sys.argv[1]); torch.save(torch.nan_to_num(x.softmax(-1), nan=0.0), sys.argv[2])"
    subprocess.run([sys.executable, "-c", code, folder + "/in.pt", folder + "/out.pt"], check=True, timeout=120)
    p = _straight_through(scores, torch.load(folder + "/out.pt"))'''
CUSTOM_OP = '''p = _straight_through(scores, torch.ops.camp_student.attend(scores.detach()))'''
CUSTOM_OP_PRELUDE = PRELUDE + '''
_lib = torch.library.Library("camp_student", "DEF")
_lib.define("attend(Tensor s) -> Tensor")
_lib.impl("attend", _kernel, "CPU")

'''
VIA_FORWARD_BACKWARD = '''p = _straight_through(scores, forward_backward(_forbidden(), scores, -1)[0])'''
VIA_CHECKPOINT = '''p = checkpoint(_forbidden(), scores, -1)'''
# the exercise's name bound to torch's own operator: the grader's call of it is the student's call
ASSIGNED = PRELUDE.replace("def _safe_softmax(self):", "def scaled_dot_product_attention(self):\n        return None\n\n"
                           "    def _safe_softmax(self):") + '''

def _sdpa(ns=torch.ops.aten):
    return ns.scaled_dot_product_attention.default


scaled_dot_product_attention = _sdpa()
'''

# honest: their own softmax, computed in a thread pool; attention scores with einsum
HONEST_THREADS = '''with concurrent.futures.ThreadPoolExecutor(2) as pool:
        p = pool.submit(softmax, scores, -1).result()'''
HONEST_EINSUM = REF["sdpa"].replace("scores = (q @ k.transpose(-2, -1)) / math.sqrt(E)",
                                    "scores = torch.einsum('...le,...se->...ls', q, k) / math.sqrt(E)")
# tampering: closing every socket the process holds (the observer's channel is one)
CLOSE_CHANNEL = '''
import os, stat
for _fd in range(3, 256):
    try:
        if stat.S_ISSOCK(os.fstat(_fd).st_mode):
            os.close(_fd)
    except OSError:
        pass
'''

EXPECTED_FAILED = {
    "ada": [], "honest_threads": [], "honest_einsum": [],
    "thread": SDPA_AND_MHA, "thread_pool": SDPA_AND_MHA, "fork": SDPA_AND_MHA, "process_pool": SDPA_AND_MHA,
    "fresh_python": SDPA_AND_MHA, "custom_op": SDPA_AND_MHA,
    "via_forward_backward": SDPA_AND_MHA, "via_checkpoint": SDPA_AND_MHA, "assigned": SDPA_AND_MHA,
    "close_channel": ALL,
}


def _stray(nb, after, source):
    import nbformat
    i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == after)
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("observer")
    subs, out = tmp / "submissions", tmp / "workspace"
    nbs = {
        "ada": student_notebook(LAB),
        "honest_threads": student_notebook(LAB, {"sdpa": _attack(HONEST_THREADS)}),
        "honest_einsum": student_notebook(LAB, {"sdpa": HONEST_EINSUM}),
        "thread": student_notebook(LAB, {"sdpa": _attack(THREAD)}),
        "thread_pool": student_notebook(LAB, {"sdpa": _attack(THREAD_POOL)}),
        "fork": student_notebook(LAB, {"sdpa": _attack(FORK)}),
        "process_pool": student_notebook(LAB, {"sdpa": _attack(PROCESS_POOL)}),
        "fresh_python": student_notebook(LAB, {"sdpa": _attack(FRESH_PYTHON)}),
        "custom_op": student_notebook(LAB, {"sdpa": _attack(CUSTOM_OP, CUSTOM_OP_PRELUDE)}),
        "via_forward_backward": student_notebook(LAB, {"sdpa": _attack(VIA_FORWARD_BACKWARD)}),
        "via_checkpoint": student_notebook(LAB, {"sdpa": _attack(VIA_CHECKPOINT)}),
        "assigned": student_notebook(LAB, {"sdpa": ASSIGNED}),
        "close_channel": _stray(student_notebook(LAB), "softmax", CLOSE_CHANNEL),
    }
    for student, nb in nbs.items():
        write_submission(subs, student, LAB, nb)
    isolation = "namespace" if namespaces_available() else "none"
    rows = grade(subs, Catalog.load(), ROOT, out, None,
                 GradeOptions(jobs=2, cell_timeout=60, isolation=isolation, seed=4321))
    return {r.student: r for r in rows}, saved_results(out, "b01_attention")


def _messages(details, student):
    return " | ".join(t["message"] for t in details[student]["tests"] if t["message"])


@pytest.mark.parametrize("student", sorted(EXPECTED_FAILED))
def test_each_route_to_a_forbidden_kernel_costs_exactly_its_tests(graded, student):
    rows, details = graded
    assert_b01_loses_exactly(rows, details, student, EXPECTED_FAILED[student])


@pytest.mark.parametrize("student, entry", [
    *((s, "torch.softmax") for s in ("thread", "thread_pool", "fork", "process_pool", "custom_op",
                                     "via_forward_backward", "via_checkpoint")),
    ("assigned", "torch.nn.functional.scaled_dot_product_attention"),
])
def test_the_forbidden_call_is_named_wherever_it_ran(graded, student, entry):
    _, details = graded
    message = _messages(details, student)
    assert "your code called" in message and entry in message and "tampering" not in message, message


def test_no_new_interpreter_starts(graded):
    _, details = graded
    assert "PermissionError" in _messages(details, "fresh_python"), _messages(details, "fresh_python")


def test_closing_the_channel_is_tampering(graded):
    _, details = graded
    assert "tampering" in _messages(details, "close_channel"), _messages(details, "close_channel")
