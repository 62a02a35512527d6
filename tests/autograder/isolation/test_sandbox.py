"""The student's process as the grader sees it: stand-ins call the student's code, objects built
with `make` live next to it, and everything crosses as tensors and plain data."""
import subprocess
import sys

import pytest
import torch

from autograder import checks
from autograder.checks import load_parameters, make, parameters_of
from autograder.grading.remote import RemoteObject, Session, StudentError
from autograder.isolation.sandbox import Sandbox, namespaces_available

STUDENT_CODE = '''
import torch
def last_logits(model, idx):
    logits, _ = model(idx)
    return logits[:, -1]

def doubled_sum(t):
    import torch.distributed as dist
    dist.all_reduce(t)
    return 2 * t
'''


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    isolation = "bwrap" if namespaces_available() else "none"
    sandbox = Sandbox(tmp_path_factory.mktemp("sandbox") / "s", isolation=isolation)
    sandbox.start()
    s = Session(sandbox)
    assert s.request("exec", "cell", source=STUDENT_CODE) is None
    yield s
    sandbox.close()


def test_objects_made_for_the_student_are_used_by_their_code(session):
    config = {"vocab_size": 50, "n_layer": 1, "n_head": 2, "d_model": 16, "max_seq_len": 32}
    local = make("camplib.model.GPT", make("camplib.model.GPTConfig", **config))
    checks._grading_session = session
    try:
        remote = make("camplib.model.GPT", make("camplib.model.GPTConfig", **config))
    finally:
        checks._grading_session = None
    assert isinstance(remote, RemoteObject)
    load_parameters(remote, parameters_of(local))
    idx = torch.randint(0, 50, (2, 7))
    got = RemoteObject(session, "last_logits", "last_logits")(remote, idx)
    torch.testing.assert_close(got, local(idx)[0][:, -1], rtol=0, atol=0)
    logits, loss = remote(idx)                       # a module's tuple comes back as a tuple
    assert loss is None and torch.equal(logits, local(idx)[0])


def test_make_refuses_anything_outside_the_course_and_torch(session):
    with pytest.raises(ValueError, match="not in"):
        make("os.system", "true")
    with pytest.raises(StudentError, match="not allowed"):
        session.request("make", "os.system(...)", path="os.system", args=["true"], kwargs={})


def test_a_students_function_runs_on_ranks_inside_the_sandbox(session):
    """Distributed labs: the student's function is passed by name to a course helper, which
    forks the ranks next to it (loopback networking only) and returns plain tensors."""
    inputs = [torch.full((4,), 1.0), torch.full((4,), 2.0)]
    checks._grading_session = session
    try:
        out = make("camplib.dist.harness.run_collective", RemoteObject(session, "doubled_sum", "doubled_sum"), inputs)
    finally:
        checks._grading_session = None
    assert [o.tolist() for o in out["outputs"]] == [[6.0] * 4, [6.0] * 4]
    assert out["calls"] == [{"allreduce": 1}, {"allreduce": 1}] and out["bytes_sent"] == [0, 0]
    with pytest.raises(StudentError, match="not defined in your notebook"):
        session.make("camplib.dist.harness.run_collective", [RemoteObject(session, "missing", "missing"), inputs], {})


# Another grading sandbox at its limit: it leases a uid as sandboxes do and fills the uid's task
# count (RLIMIT_NPROC counts threads per uid, machine-wide) past the 256 a sandbox may use.
FULL_UID = """
import os, sys, threading
from autograder.isolation.uids import UidLease
lease = UidLease()
os.setgroups([]); os.setgid(lease.uid); os.setuid(lease.uid)
for _ in range(300):
    threading.Thread(target=sys.stdin.read, daemon=True).start()
print(lease.uid, flush=True)
sys.stdin.read()
"""
FORKS = """
import os
def forks(n):
    pids = [os.fork() or os._exit(0) for _ in range(n)]   # the child exits at once
    return [os.waitpid(p, 0)[1] for p in pids]
"""


@pytest.mark.skipif(not namespaces_available(), reason="bwrap sandbox unavailable: uids are a sandbox's")
def test_a_sandbox_full_of_tasks_beside_it_does_not_stop_its_forks(session):
    """A sandbox's uid is leased machine-wide, never a fixed number: under one uid, a concurrent
    sandbox's fork storm made this one's rank processes fail to fork (BlockingIOError: EAGAIN)."""
    assert session.sandbox.uid is not None
    hog = subprocess.Popen([sys.executable, "-c", FULL_UID], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        full = int(hog.stdout.readline())
        assert session.request("exec", "forks", source=FORKS) is None
        assert RemoteObject(session, "forks", "forks")(8) == [0] * 8, f"uid {full} full, this sandbox's {session.sandbox.uid}"
    finally:
        hog.stdin.close()
        hog.wait(30)


SEND = '''
import socket
def send_over_loopback(n):
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    client.sendall(b"x" * n)
    got = 0
    while got < n:
        got += len(peer.recv(1 << 16))
    for s in (client, peer, server):
        s.close()
    return got
'''


def test_the_grader_counts_the_sandboxs_loopback_bytes_itself(session):
    """`loopback_traffic` in a test reads the kernel's counter of the student's network namespace
    from outside: what their code really sent, at least (TCP adds headers: 64 KiB of payload
    takes ~2 KiB more; the handshake and closing add a few hundred bytes)."""
    assert session.request("exec", "cell", source=SEND) is None
    send = RemoteObject(session, "send_over_loopback", "send_over_loopback")
    checks._grading_session = session
    try:
        with checks.loopback_traffic() as wire:
            assert send(1 << 16) == 1 << 16
        with checks.loopback_traffic() as idle:
            pass
    finally:
        checks._grading_session = None
    assert 1 << 16 <= wire.sent < (1 << 16) + 16384, wire.sent
    if session.sandbox.isolation == "bwrap":   # nothing else talks in the sandbox's own namespace
        assert idle.sent == 0


def test_loopback_traffic_in_the_notebook_counts_this_machines_loopback():
    with checks.loopback_traffic() as wire:
        exec(SEND + "assert send_over_loopback(1000) == 1000", {})
    assert wire.sent >= 1000


FONT_LISTS = '''
def font_lists():
    import os
    import matplotlib.font_manager as fm
    folder = os.environ["MPLCONFIGDIR"]
    mine = os.path.join(folder, f"fontlist-v{fm.FontManager.__version__}.json")
    cached = fm.json_load(mine)
    scanned = fm.FontManager()   # what this sandbox finds when it scans its fonts itself
    names = lambda m: sorted(f.fname for f in m.ttflist + m.afmlist)
    return {"cached": names(cached), "scanned": names(scanned), "writable": os.access(mine, os.W_OK),
            "usable": getattr(cached, "_version", None) == fm.FontManager.__version__}
'''


@pytest.mark.skipif(not namespaces_available(), reason="bwrap sandbox unavailable: the font list is a sandbox's")
def test_a_sandbox_starts_with_the_font_list_it_would_have_scanned(session):
    """`make setup` makes matplotlib's font list once (autograder.isolation.font_cache) and every
    sandbox starts with a copy of its own, so none scans the fonts again; it lists exactly the
    fonts the sandbox finds (as matplotlib would use it: same version), and the student may rewrite it."""
    from autograder.isolation import font_cache
    from tests.support import not_run
    if font_cache.cache_dir() is None:
        not_run(f"SANDBOX FONT LIST NOT RUN: no font list in {font_cache.CACHE} (`make setup` makes it)")
    assert session.request("exec", "cell", source=FONT_LISTS) is None
    got = RemoteObject(session, "font_lists", "font_lists")()
    assert got["usable"] and got["writable"], got
    assert got["cached"] == got["scanned"] and got["cached"], (got["cached"], got["scanned"])
