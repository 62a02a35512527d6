"""The no-exec filter the student's process installs on itself (autograder.isolation.seccomp)."""
import subprocess
import sys

import pytest

from autograder.isolation import seccomp

CHILD = r"""
import os, subprocess, threading
from autograder.isolation.seccomp import forbid_exec
started = threading.Event()
waiting = threading.Thread(target=lambda: (started.set(), threading.Event().wait(0.5)))
waiting.start(); started.wait()               # a thread that existed before the filter
forbid_exec()
result = {}
try:
    subprocess.run(["/bin/true"], check=True)
    result["main"] = "ran"
except PermissionError:
    result["main"] = "refused"
def in_thread():
    try:
        os.execv("/bin/true", ["true"])
    except PermissionError:
        result["thread"] = "refused"
t = threading.Thread(target=in_thread); t.start(); t.join()
pid = os.fork()
if pid == 0:
    try:
        os.execv("/bin/true", ["true"])
    except PermissionError:
        os._exit(7)
result["child"] = os.waitpid(pid, 0)[1] >> 8
print(result)
"""


@pytest.mark.skipif(not seccomp.supported() or not sys.platform.startswith("linux"), reason="Linux x86-64/aarch64 only")
def test_no_program_starts_in_the_process_its_threads_or_its_children():
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "{'main': 'refused', 'thread': 'refused', 'child': 7}", run.stdout


def test_the_filter_refuses_only_execve_and_execveat():
    import struct
    for machine in ("x86_64", "aarch64"):
        program = seccomp.no_exec_program(machine)
        assert len(program) % 8 == 0
        steps = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
        compared = {k for code, _, _, k in steps if code == seccomp.JEQ}
        calls = seccomp._ARCHES[machine][1]
        assert compared == {seccomp._ARCHES[machine][0], calls["execve"], calls["execveat"]}
        assert steps[-1] == (seccomp.RET, 0, 0, seccomp.RET_ALLOW)
