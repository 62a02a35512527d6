"""Grading an instructor can trust: one hostile or broken submission per attack, graded in one
class next to an honest reference, each with its exact expected outcome.

Every attacker's code is otherwise the reference solution, so a score tells exactly which
tests the attack cost or (if it worked) gained. `ada` submits the plain reference: her grade
must stay 12/12 whatever the others do. Needs root and bubblewrap (the sandbox), which CI has;
elsewhere the module is skipped with that reason. The sandbox's own attack families are in
test_attacks_isolation.
"""
import csv
import json
import os
import socket
import subprocess
import sys
import threading

import nbformat
import pytest

from autograder.catalog import Catalog, repo_root
from autograder.course.reference import (
    solution_cells,
    student_notebook,
    write_submission,
)
from autograder.grading.grade import GradeOptions, grade
from autograder.isolation.sandbox import namespaces_available
from autograder.isolation.uids import FIRST_UID as BASE_UID
from tests.support import failed_tests, saved_results

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not namespaces_available(), reason="the bwrap sandbox needs root and bubblewrap")]

ROOT = repo_root()
LAB = "b01"
MARKER = "4242.5"  # sleep duration that identifies processes started by the attackers


def _cell(nb, after_grade_id, source):
    """Insert a plain code cell after the cell with `after_grade_id`."""
    i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == after_grade_id)
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
    return nb


def _duplicate(nb, grade_id, source):
    """A second copy of the graded cell `grade_id` (same metadata) holding `source`, right after it."""
    i = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    copy = nbformat.from_dict(json.loads(json.dumps(nb.cells[i])))
    copy.source = source
    nb.cells.insert(i + 1, copy)
    return nb


def _wrong_unless(condition_code):
    """Masks that are correct only if `condition_code` (run inside causal_mask) is True: the
    attack 'worked' exactly when test_masks passes. Nothing else depends on causal_mask."""
    return solution_cells(LAB)["masks"].replace("def causal_mask(", "def _true_causal_mask(", 1) + f'''

def causal_mask(L, S=None, device=None):
    try:
        ok = bool({condition_code})
    except Exception:
        ok = False
    return _true_causal_mask(L, S, device) if ok else torch.ones(L, L if S is None else S, dtype=torch.bool)
'''


WRONG_MASKS = _wrong_unless("False")


class Listener:
    """A TCP server on the host's loopback that records whether anyone connected."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(5)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = False
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                pass


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("attacks")
    subs, out = tmp / "submissions", tmp / "workspace"
    listener = Listener()
    solution_path = Catalog.load().get(LAB).source_path(ROOT)
    attacks = {
        "ada": student_notebook(LAB),
        # tests outside the student's interpreter
        "patch_checks": _cell(student_notebook(LAB, {"masks": WRONG_MASKS}), "masks",
                              "import autograder.checks as c, numpy, torch\n"
                              "c.check_close = c.check_equal = c.check_true = lambda *a, **k: None\n"
                              "numpy.testing.assert_allclose = lambda *a, **k: None\n"
                              "torch.testing.assert_close = lambda *a, **k: None\n"
                              "torch.allclose = lambda *a, **k: True\n"
                              "torch.tril = lambda x, *a, **k: torch.ones_like(x)\n"),
        "fake_eq": student_notebook(LAB, {"masks": solution_cells(LAB)["masks"] +
                                          "\nclass Anything:\n    def __eq__(self, o): return True\n"
                                          "    def __bool__(self): return True\n"
                                          "def causal_mask(L, S=None, device=None):\n    return Anything()\n"}),
        "shadow": student_notebook(LAB, {"masks": WRONG_MASKS}),
        # reading what is hidden, by absolute and relative path
        "read_solutions": student_notebook(LAB, {"masks": _wrong_unless(f"open({str(solution_path)!r}).read()")}),
        "read_gradebook": student_notebook(LAB, {"masks": _wrong_unless(f"open({str(out / 'gradebook.db')!r}, 'rb').read()")}),
        "read_relative": student_notebook(LAB, {"masks": _wrong_unless(
            "any(os.path.exists(p) for p in ['../../../gradebook.db', '../../../source', '../source', "
            f"{str(out / 'source')!r}, {str(subs / 'ada')!r}])")}),
        "read_git": student_notebook(LAB, {"masks": _wrong_unless(f"os.listdir({str(ROOT / '.git')!r})")}),
        # writing the gradebook
        "write_gradebook": _cell(student_notebook(LAB, solve=False), "softmax",
                                 "import sqlite3\n"
                                 f"db = sqlite3.connect({str(out / 'gradebook.db')!r})\n"
                                 "db.execute('UPDATE grade SET auto_score = 0'); db.commit()\n"),
        # crashes and hangs cost only what they hit
        "exit_in_cell": _cell(student_notebook(LAB), "masks", "import os\nos._exit(3)"),
        "segfault_in_cell": _cell(student_notebook(LAB), "masks", "import ctypes\nctypes.string_at(0)"),
        "exit_in_mha": _cell(student_notebook(LAB), "mha",
                             "import os\nMultiHeadAttention.forward = lambda self, *a, **k: os._exit(1)"),
        "memory_hog": _cell(student_notebook(LAB), "masks", "hog = bytearray(64 * 2**30)"),
        "hang_ignoring_sigint": _cell(student_notebook(LAB), "masks",
                                      "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"),
        "hang_in_mask": student_notebook(LAB, {"masks": solution_cells(LAB)["masks"].replace(
            "def causal_mask(", "def _causal_mask(", 1) + "\ndef causal_mask(*a, **k):\n    while True:\n        pass\n"}),
        # structure damage is repaired and reported
        "duplicated_cells": _duplicate(student_notebook(LAB), "softmax", "def softmax(x, dim=-1):\n    return torch.zeros_like(x)\n"),
        "noisy_stderr": _cell(student_notebook(LAB), "softmax",
                              "import sys, warnings\n_quiet = softmax\n"
                              "def softmax(x, dim=-1):\n    print('debug', file=sys.stderr)\n"
                              "    warnings.warn('careful')\n    return _quiet(x, dim)\n"),
        # leftovers and the network
        # (forked: the sandbox starts no new program), one of them in a session of its own
        "leftover_processes": _cell(student_notebook(LAB), "softmax",
                                    "import os, time\n"
                                    "if os.fork() == 0:\n"
                                    "    os.setsid()\n"
                                    "    if os.fork() == 0:\n"
                                    f"        time.sleep({MARKER})\n"
                                    f"    time.sleep({MARKER})\n"
                                    "    os._exit(0)\n"),
        "network": student_notebook(LAB, {"masks": _wrong_unless(
            f"__import__('socket').create_connection(('127.0.0.1', {listener.port}), timeout=2)")}),
        # forbidden APIs, plain and obfuscated
        "forbidden_sdpa": student_notebook(LAB, {"sdpa": "import torch.nn.functional as F\n"
                                                         "def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False):\n"
                                                         "    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)\n"}),
        "forbidden_obfuscated": student_notebook(LAB, {"sdpa": "import torch\n"
                                                               "_f = getattr(torch.nn.functional, 'scaled_dot_' + 'product_attention')\n"
                                                               "def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False):\n"
                                                               "    return _f(q, k, v, attn_mask=attn_mask, is_causal=is_causal)\n"}),
    }
    for student, nb in attacks.items():
        write_submission(subs, student, LAB, nb)
    (subs / "shadow" / "b01_attention" / "torch.py").write_text("raise SystemExit('shadowed')\n")
    (subs / "shadow" / "b01_attention" / "autograder.py").write_text("check_close = lambda *a, **k: None\n")
    # damage the structure of a correct notebook in every way nbgrader chokes on
    damaged = student_notebook(LAB)
    ids = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in damaged.cells}
    damaged.cells.remove(ids["test_masks"])                           # deleted test cell
    ids["test_softmax"].cell_type = "markdown"                        # re-typed test cell
    ids["test_softmax"].pop("outputs", None), ids["test_softmax"].pop("execution_count", None)
    ids["sdpa"].metadata = {}                                         # stripped solution cell
    ids["parameters"].source = "device, seed, n_hidden_cases, heatmap_text = 'cpu', 0, 0, ''"  # edited locked cell
    write_submission(subs, "damaged", LAB, damaged)

    options = GradeOptions(jobs=2, cell_timeout=15)
    rows = grade(subs, Catalog.load(), ROOT, out, None, options)
    listener.stop = True
    results = {r.student: r for r in rows}
    details = saved_results(out, "b01_attention")
    return out, results, details, listener


def test_honest_student_is_unaffected_by_everyone_else(graded):
    _, rows, details, _ = graded
    assert (rows["ada"].score, rows["ada"].max_score, rows["ada"].status) == (12, 12, "graded")


@pytest.mark.parametrize("student", ["fake_eq", "shadow"])
def test_tests_run_outside_the_students_interpreter(graded, student):
    _, rows, details, _ = graded
    assert rows[student].score == 10 and failed_tests(details, student) == ["test_masks"]


def test_replacing_library_functions_is_tampering(graded):
    """The tests run outside the student's interpreter, but the course's helpers (harnesses,
    runners) run inside it: a submission that replaces library functions in its own process
    changes what they report, so any such write costs every test, with the line."""
    _, rows, details, _ = graded
    assert rows["patch_checks"].score == 0 and rows["patch_checks"].status == "graded"
    message = next(t["message"] for t in details["patch_checks"]["tests"] if t["grade_id"] == "test_mha")
    assert "line 2: assigns to autograder.checks.check_close" in message and "tampering" in message, message


def test_fake_eq_is_reported_as_ungradable_value(graded):
    _, _, details, _ = graded
    message = next(t["message"] for t in details["fake_eq"]["tests"] if t["grade_id"] == "test_masks")
    assert "cannot be graded" in message or "expected a tensor" in message


@pytest.mark.parametrize("student", ["read_solutions", "read_gradebook", "read_relative", "read_git"])
def test_solutions_gradebook_and_other_students_are_unreadable(graded, student):
    _, rows, details, _ = graded
    assert failed_tests(details, student) == ["test_masks"] and rows[student].score == 10


def test_gradebook_cannot_be_written(graded):
    out, rows, _, _ = graded
    assert rows["write_gradebook"].score == 0
    with open(out / "grades.csv") as f:
        sheet = {r["student"]: float(r["score"]) for r in csv.DictReader(f)}
    assert sheet["ada"] == 12 and sheet["exit_in_cell"] == 12


@pytest.mark.parametrize("student", ["exit_in_cell", "segfault_in_cell", "memory_hog", "hang_ignoring_sigint"])
def test_a_crashing_or_hanging_cell_is_skipped_and_the_rest_is_graded(graded, student):
    _, rows, details, _ = graded
    assert rows[student].score == 12, details[student]
    assert any("skipped" in e or "MemoryError" in e for e in details[student]["cell_errors"]), details[student]["cell_errors"]


def test_a_crash_inside_a_test_costs_only_that_test(graded):
    _, rows, details, _ = graded
    assert failed_tests(details, "exit_in_mha") == ["test_mha"] and rows["exit_in_mha"].score == 8
    assert "exited" in next(t["message"] for t in details["exit_in_mha"]["tests"] if t["grade_id"] == "test_mha")
    assert failed_tests(details, "hang_in_mask") == ["test_masks"] and rows["hang_in_mask"].score == 10
    assert "timed out" in next(t["message"] for t in details["hang_in_mask"]["tests"] if t["grade_id"] == "test_masks")


def test_damaged_structure_is_repaired_and_reported(graded):
    _, rows, details, _ = graded
    assert rows["damaged"].score == 12
    assert rows["duplicated_cells"].score == 12
    notes = " | ".join(details["damaged"]["notes"])
    for fragment in ("'test_softmax' was turned into markdown", "solution cell 'sdpa' is missing",
                     "test cell 'test_masks' was deleted", "read-only cell 'parameters' was edited"):
        assert fragment in notes, notes
    assert "'softmax' appears 2 times" in " | ".join(details["duplicated_cells"]["notes"])


def test_stderr_output_does_not_zero_a_passing_test(graded):
    _, rows, _, _ = graded
    assert rows["noisy_stderr"].score == 12


def _under_another_process_tree(pid: int) -> bool:
    """True when `pid` descends from a live Python process other than this one (another test
    worker's grading pool: sandboxes hang below it through bwrap), False when its ancestors are
    this process, non-Python processes and init alone (an orphan: what a leftover would be)."""
    me = os.getpid()
    while pid > 1:
        try:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            argv0 = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0", 1)[0]
        except (OSError, ValueError, IndexError):
            return False
        if pid == me:
            return False
        if pid > 1 and b"python" in os.path.basename(argv0):
            return True
    return False


def test_no_process_outlives_grading_and_the_network_is_closed(graded):
    _, rows, details, listener = graded
    ps = subprocess.run(["ps", "-eo", "pid=,uid=,args="], capture_output=True, text=True).stdout
    # ours: the attackers' marked sleeps, and this run's sandbox uids running this checkout's
    # Python. A uid is leased only while a grading worker lives, so once this class is graded
    # another grader on the machine (the other attack suites under pytest-xdist) may lease the
    # same uid for its own sandboxes: those descend from its live workers, a leftover of ours
    # from nobody but this process or, orphaned, from init.
    uids = {d["sandbox_uid"] for d in details.values() if d.get("sandbox_uid") is not None}
    assert uids and all(uid >= BASE_UID for uid in uids), uids
    leftovers = [l for l in ps.splitlines()
                 if MARKER in l or (int(l.split()[1]) in uids and sys.executable in l
                                    and not _under_another_process_tree(int(l.split()[0])))]
    assert leftovers == []
    assert rows["leftover_processes"].score == 12
    assert listener.connections == 0 and rows["network"].score == 10


def test_forbidden_apis_score_zero_on_the_affected_tests(graded):
    _, rows, details, _ = graded
    for student in ("forbidden_sdpa", "forbidden_obfuscated"):
        assert failed_tests(details, student) == ["test_mha", "test_sdpa"], details[student]["tests"]
        message = next(t["message"] for t in details[student]["tests"] if t["grade_id"] == "test_sdpa")
        assert "torch.nn.functional.scaled_dot_product_attention" in message and "forbid" in message
