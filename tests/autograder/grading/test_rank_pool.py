"""The ranks the grader starts for a distributed test (autograder.grading.rank_pool): one
sandbox per rank, sharing the student's sandbox's loopback network and nothing else, each
receiving only its own input. A rank cannot see another's files (/tmp, /dev/shm) or processes;
nor reach its abstract Unix sockets or NETLINK_USERSOCK ports (a rank may open IPv4, IPv6 and
netlink route sockets only, autograder.isolation.seccomp);
what it sends on the loopback network counts in the grader's measurement, and the collectives
it calls are what the grader's observer saw (whichever way they were called, the c10d operators'
Python names included); the course's rank
function runs the student's function there and the same call in a notebook forks the ranks.
Needs root and bubblewrap for the sandbox tests (skipped elsewhere with that reason)."""
import pytest
import torch

from autograder import checks
from autograder.grading.engine import _observer_failed, _Student
from autograder.grading.rank_pool import RankPool
from autograder.grading.remote import RemoteObject, Session, StudentError
from autograder.isolation.sandbox import Sandbox, namespaces_available

needs_sandbox = pytest.mark.skipif(not namespaces_available(), reason="the bwrap sandbox needs root and bubblewrap")

STUDENT_CODE = '''
import os, socket, threading
import torch
import torch.distributed as dist


_kept = []


def plant(port):
    """Leave a secret in /tmp and /dev/shm, listen on an abstract Unix socket, and take whatever
    arrives on `port`."""
    for folder in ("/tmp", "/dev/shm"):
        with open(f"{folder}/secret", "w") as f:
            f.write("rank input")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind("\\0camp-secret")   # the network namespace's abstract names, which a rank's sandbox shares
    unix.listen(1)
    _kept.append(unix)
    usersock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2)   # NETLINK_USERSOCK: ports named in the namespace
    usersock.bind((4242, 0))
    _kept.append(usersock)
    server = socket.create_server(("127.0.0.1", port))
    def take():
        peer, _ = server.accept()
        while peer.recv(1 << 16):
            pass
        peer.sendall(b"!")   # everything arrived: the sender may return
    threading.Thread(target=take, daemon=True).start()
    return os.getpid()


def hold(nbytes, where):
    """Keep `nbytes` in this process's memory, or in a file on its tmpfs."""
    if where == "memory":
        _kept.append(torch.ones(nbytes // 4))
    else:
        with open(f"{where}/held", "wb") as f:
            for _ in range(nbytes >> 20):   # by the MiB: nothing big passes through its memory
                f.write(b"x" * (1 << 20))


def look_and_send(port, nbytes):
    """What this process sees of the other's, and `nbytes` sent to it over the loopback network."""
    seen = {folder: os.path.exists(f"{folder}/secret") for folder in ("/tmp", "/dev/shm")}
    pythons = sum(1 for p in os.listdir("/proc") if p.isdigit())
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
            unix.connect("\\0camp-secret")
            seen["unix"] = "connected"
    except PermissionError:
        seen["unix"] = "refused"
    except OSError as exc:
        seen["unix"] = repr(exc)
    try:   # a message to the other sandbox's NETLINK_USERSOCK port (from one uid to another: delivered, unfiltered)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2) as usersock:
            usersock.sendto(bytes(16) + b"rank input", (4242, 0))
            seen["netlink"] = "sent"
    except PermissionError:
        seen["netlink"] = "refused"
    except OSError as exc:
        seen["netlink"] = repr(exc)
    for family in (socket.AF_INET6, socket.AF_NETLINK):   # what the rank may open: IPv6, netlink's route family
        socket.socket(family, socket.SOCK_DGRAM if family == socket.AF_INET6 else socket.SOCK_RAW).close()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"x" * nbytes)   # returns once buffered, not sent: the receiver's window paces the wire
        s.shutdown(socket.SHUT_WR)
        assert s.recv(1) == b"!"   # the receiver read it all: every byte has crossed the loopback
    return {"seen": seen, "processes": pythons}


def second_rank_raises(t):
    """Rank 1's own mistake before the sum; rank 0 waits in the sum and sees the group break."""
    if dist.get_rank() == 1:
        raise ValueError("rank one's own mistake")
    dist.all_reduce(t)
    return t


def by_collectives(t):
    """A sum by torch's all-reduce, then a broadcast called on the backend itself (no dispatcher),
    then an all-gather and a sum through the operators' Python names (torch.ops.c10d's, the
    functional collectives', as funcol.all_reduce calls it: its own first call costs ~6 s)."""
    dist.all_reduce(t)
    dist.group.WORLD._get_backend(torch.device("cpu")).broadcast([t]).wait()
    gathered = torch.empty(dist.get_world_size() * t.numel(), dtype=t.dtype)
    torch.ops.c10d._allgather_base_.default(gathered, t, dist.group.WORLD.boxed(), False, -1)[1].wait()
    functional = torch.ops._c10d_functional
    return functional.wait_tensor(functional.all_reduce(gathered.view(-1, t.numel()).sum(0), "sum",
                                                        dist.group.WORLD.group_name))


def ring_sum(t):
    r, n = dist.get_rank(), dist.get_world_size()
    acc, piece = t.clone(), t.clone()
    for _ in range(n - 1):
        into = torch.empty_like(piece)
        reqs = [dist.isend(piece, (r + 1) % n), dist.irecv(into, (r - 1) % n)]
        for q in reqs:
            q.wait()
        acc += into
        piece = into
    return acc
'''


@pytest.fixture(scope="module")
def main(tmp_path_factory):
    if not namespaces_available():
        pytest.skip("the bwrap sandbox needs root and bubblewrap")
    student = _Student(Sandbox(tmp_path_factory.mktemp("ranks") / "s", isolation="bwrap"), float("inf"))
    student.start()
    student.run_cell(STUDENT_CODE)
    yield student
    if student.pool is not None:
        student.pool.close()
    student.sandbox.close()


@pytest.mark.slow   # with the module's sandbox: five sandbox starts, ~36 s at load 18 on 2 cores
@needs_sandbox
def test_a_rank_sandbox_shares_the_loopback_network_and_nothing_else(main, tmp_path):
    rank = _Student(Sandbox(main.sandbox.staging, isolation="bwrap", log=tmp_path / "rank.log", net_of=main.sandbox),
                    float("inf"))
    try:
        rank.ran = list(main.ran)
        rank.start()
        rank.replay()
        RemoteObject(main.session, "plant", "plant")(29411)
        before = main.sandbox.loopback_bytes()
        got = RemoteObject(rank.session, "look_and_send", "look_and_send")(29411, 1 << 20)
        assert got["seen"] == {"/tmp": False, "/dev/shm": False, "unix": "refused", "netlink": "refused"}, got
        assert got["processes"] <= 3, got   # its own PID namespace: bwrap's init, sandbox_init, itself
        assert main.sandbox.loopback_bytes() - before >= 1 << 20   # its traffic is in the grader's count
        assert rank.sandbox.uid != main.sandbox.uid
    finally:
        rank.sandbox.close()


@pytest.mark.slow   # with the module's sandbox: five sandbox starts, ~36 s at load 18 on 2 cores
@needs_sandbox
def test_the_pool_runs_each_rank_on_its_own_input_in_its_own_sandbox(main):
    main.pool = RankPool(main, [], lambda box: _Student(box, main.deadline), _observer_failed)
    main.session = Session(main.sandbox, main.deadline, ranks=main.pool)
    main.pool.prestart(2)   # as grading does while the cells run: started, none of the student's code in them yet
    assert [(s.replayed, s.ran) for s in main.pool.ranks] == [(False, [])] * 2
    inputs = [torch.full((3,), float(r + 1), dtype=torch.float64) for r in range(3)]
    checks._grading_session = main.session
    try:
        with checks.loopback_traffic() as wire:
            out = checks.separate_ranks("camplib.dist.harness.collective_rank",
                                        RemoteObject(main.session, "ring_sum", "ring_sum"), inputs)
        collective = checks.separate_ranks("camplib.dist.harness.collective_rank",
                                           RemoteObject(main.session, "by_collectives", "by_collectives"), inputs[:2])
        with pytest.raises(StudentError, match="rank 0 of 2.*not defined in your notebook"):
            checks.separate_ranks("camplib.dist.harness.collective_rank",
                                  RemoteObject(main.session, "missing", "missing"), inputs[:2])
        # the rank that raised is what the student reads first, not rank 0's broken connection
        with pytest.raises(StudentError, match=r"(?s)^rank 1 of 2: .*rank one's own mistake.*also failed: rank 0"):
            checks.separate_ranks("camplib.dist.harness.collective_rank",
                                  RemoteObject(main.session, "second_rank_raises", "second_rank_raises"), inputs[:2])
        assert len({student.sandbox.uid for student in main.pool.ranks}) == 3
        assert all(s.replayed and s.ran == main.ran for s in main.pool.ranks)   # the third started on demand
        assert main.pool.verdict() == ""   # no forbidden call, every rank's observer intact (collectives' canaries too)
    finally:
        checks._grading_session = None
        main.pool.close()
    assert [o.tolist() for o in out["outputs"]] == [[6.0] * 3] * 3
    assert out["bytes_sent"] == [2 * 24] * 3 and all(c.get("send") == 2 for c in out["calls"]), out
    assert out["collectives"] == [[]] * 3, out   # what the grader saw: sends only
    assert [o.tolist() for o in collective["outputs"]] == [[12.0] * 3] * 2
    assert collective["collectives"] == [["_allgather_base", "_c10d_functional::all_reduce", "allreduce", "broadcast"]] * 2, \
        collective
    assert wire.sent >= 3 * 2 * 24


@pytest.mark.slow   # with the module's sandbox: ~1 s
@needs_sandbox
def test_the_grader_measures_what_a_sandbox_holds_in_memory_and_in_its_files(main):
    for where in ("memory", "/dev/shm", "/tmp"):
        before = main.sandbox.resident_bytes()
        RemoteObject(main.session, "hold", "hold")(12 << 20, where)   # a file: under the 16 MiB limit
        assert 12 << 20 <= main.sandbox.resident_bytes() - before < 16 << 20, where


def test_in_a_notebook_the_same_call_forks_the_ranks():
    namespace = {}
    exec(STUDENT_CODE, namespace)
    out = checks.separate_ranks("camplib.dist.harness.collective_rank", namespace["ring_sum"],
                                [torch.ones(2), 2 * torch.ones(2)])
    assert [o.tolist() for o in out["outputs"]] == [[3.0, 3.0]] * 2 and out["bytes_sent"] == [8, 8]
    assert out["resident_bytes"] == [[], []]   # collective_rank never pauses


def test_a_head_start_that_cannot_start_leaves_the_ranks_to_the_test(tmp_path):
    """RankPool.prestart is only a head start: when its sandboxes cannot start (here the student's
    sandbox, whose network they join, is not running) it raises nothing and holds no rank; the test
    that needs ranks starts them and reports what fails then."""
    main = _Student(Sandbox(tmp_path / "s", isolation="bwrap"), float("inf"))
    pool = RankPool(main, [], lambda box: _Student(box, main.deadline), _observer_failed)
    pool.prestart(2)
    assert pool.ranks == []


def test_the_rank_whose_code_failed_is_reported_before_its_peers_broken_connections():
    """rank_pool._first_cause: a rank that only saw the group break under it (gloo's connection
    errors, a collective's timeout) comes after one whose own code raised, whatever their ranks;
    among equals the lowest rank first; every other rank's first line follows; a grader-side
    exception (not a StudentError) is raised as it is."""
    from autograder.grading.rank_pool import _first_cause
    broken = StudentError("join_and_run(...) raised RuntimeError: [gloo] Read error: Connection reset by peer.\n  a cell")
    timed = StudentError("join_and_run(...) raised DistBackendError: Timed out waiting 30000ms for recv")
    own = StudentError("join_and_run(...) raised ValueError: shapes differ\n  a cell, line 4")
    got = str(_first_cause([(0, broken), (1, timed), (2, own)], 3))
    assert got.startswith("rank 2 of 3: join_and_run(...) raised ValueError: shapes differ\n  a cell, line 4"), got
    assert "also failed: rank 0: join_and_run(...) raised RuntimeError" in got and "rank 1: " in got, got
    same = str(_first_cause([(1, StudentError("name 'f' is not defined")), (3, StudentError("name 'f' is not defined"))], 4))
    assert same == "rank 1 of 4: name 'f' is not defined\n(also failed: rank 3: name 'f' is not defined)", same
    assert str(_first_cause([(0, broken)], 2)).startswith("rank 0 of 2: join_and_run") and "also" not in str(_first_cause([(0, broken)], 2))
    grader = RuntimeError("the grader's own bug")
    assert _first_cause([(0, grader), (1, own)], 2) is grader
