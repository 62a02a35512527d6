"""Run a function on N ranks of `torch.distributed`: from a notebook, a script, or under torchrun.

`launch(fn, world_size, *args)` returns `[fn(0, N, *args), ..., fn(N-1, N, *args)]`;
`in_child(fn, *args)` returns `fn(*args)` computed in one forked child (no process group).

- Locally it forks N processes (fork, not spawn, so functions defined in a notebook work) that
  rendezvous on a TCP store rank 0 serves on a port the OS picked: two runs never collide.
- Under `torchrun` (RANK/WORLD_SIZE in the environment) it runs `fn` in this process with the
  ranks torchrun gave and all-gathers the return values, so the same script scales to many
  machines unchanged.
- Failures are loud and bounded: an exception on any rank is re-raised here with the rank and the
  remote traceback; a rank that dies, or a collective that never completes (mismatched calls),
  ends every rank and raises within `timeout` seconds. No process outlives the call.
- Autograd and fork: on a machine with a GPU, torch starts a thread per device at the first
  backward in a process and marks every process forked after that, where backward then raises
  ("Unable to handle autograd's threading in combination with fork-based multiprocessing").
  The process that forks ranks must never have run autograd: single-process computations that
  need it (a notebook's references) run through `in_child`. A rank that meets the error says so
  (RankError names the cause and the remedy). A CPU-only torch never marks a fork: the course's
  tests count a fake accelerator to catch it (tests/fake_accelerator.py).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait

import torch
import torch.distributed as dist

__all__ = ["launch", "in_child", "RankError", "RankDied", "RankTimeout", "default_backend", "under_torchrun"]

GRACE_SECONDS = 0.5  # after a failure, how long the other ranks get to flush output before being killed
ECHO_GRACE_SECONDS = 5.0  # after only an echo ("connection closed by peer"), how long to wait for its cause
_ECHOES = ("closed by peer", "reset by peer")
_AUTOGRAD_FORK = "autograd-and-fork"  # in torch's message for a backward in a marked fork
AUTOGRAD_FORK_HINT = (
    "\n(the process that forked this one had run autograd (a backward, autograd.grad) on a machine with "
    "an accelerator, where torch then keeps a thread per device, and no process forked after that can run "
    "backward. Keep autograd out of the process that launches ranks: compute single-process results that "
    "need it with camplib.dist.in_child(fn, *args); in a notebook, restart the kernel first)")


class RankError(RuntimeError):
    """A rank raised. `rank`, `kind` (the exception's type name) and `remote_traceback` say what."""

    def __init__(self, rank: int, kind: str, message: str, remote_traceback: str):
        self.rank, self.kind, self.remote_traceback = rank, kind, remote_traceback
        timed_out = "timed out" in message.lower() or "timeout" in message.lower()
        if timed_out:
            message += ("\n(a collective timed out: did every rank call the same collectives, in the same "
                        "order, with tensors of the same size?)")
        elif any(e in message.lower() for e in _ECHOES):
            message += "\n(another rank ended, or crashed, while this one was still in a collective)"
        elif _AUTOGRAD_FORK in message.lower():
            message += AUTOGRAD_FORK_HINT
        self.echo = not timed_out and any(e in message.lower() for e in _ECHOES)
        super().__init__(f"rank {rank} raised {kind}: {message}\n"
                         f"--- traceback on rank {rank} ---\n{remote_traceback.rstrip()}")


class RankDied(RuntimeError):
    """A rank's process ended without reporting (os._exit, a crash, killed for memory)."""


class RankTimeout(TimeoutError):
    """The ranks did not finish in time (a hung collective, an endless loop)."""


def default_backend(world_size: int | None = None) -> str:
    """NCCL where every rank can have a GPU of its own (all of this machine's ranks when
    `world_size` is given), else gloo: 4 ranks on a 1-GPU machine run on gloo, not fail."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() and dist.is_nccl_available() else 0
    return "nccl" if gpus and (world_size is None or gpus >= world_size) else "gloo"


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def launch(fn, world_size: int, *args, backend: str | None = None, timeout: float = 60.0,
           run_timeout: float | None = None) -> list:
    """[fn(rank, world_size, *args) for every rank], each rank a member of one process group.

    `timeout` (seconds) bounds every collective: a rank waiting longer for its peers raises, and
    the run ends with that error. `run_timeout` (seconds, optional) bounds the whole run: past
    it every rank is killed (an endless loop outside collectives). NCCL needs one GPU per rank;
    gloo runs anywhere.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if under_torchrun():
        backend = backend or default_backend(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        return _run_under_torchrun(fn, world_size, args, backend, timeout)
    backend = backend or default_backend(world_size)
    if backend == "nccl":
        if torch.cuda.device_count() < world_size:
            raise ValueError(f"nccl needs one GPU per rank: {world_size} ranks, "
                             f"{torch.cuda.device_count()} GPUs (use backend='gloo')")
        if torch.cuda.is_initialized():
            raise RuntimeError("CUDA was already used in this process, and a forked rank cannot use it: "
                               "call launch() before touching CUDA, or run the script under torchrun")
    if sys.platform == "win32":
        raise RuntimeError("launch() forks its ranks; on Windows run the script under torchrun")
    return _run_forked(fn, world_size, args, backend, timeout, run_timeout)


def in_child(fn, *args, **kwargs):
    """fn(*args, **kwargs) computed in a forked child of this process; its value comes back
    (tensors on the CPU), an exception in it as RankError (rank 0).

    For the single-process computations that ranks are compared with: run here, a backward on a
    machine with a GPU would leave this process unable to fork ranks that run backward (see the
    module's docstring); run in a child, it leaves this process as it was. The child forks like a
    rank (functions defined in a notebook work, arguments are not pickled) but joins no process
    group; its prints reach this process untagged."""
    return _run_forked(_call, 1, (fn, args, kwargs), None, 60.0, None)[0]


def _call(rank, world_size, fn, args, kwargs):
    return fn(*args, **kwargs)


# -- under torchrun: this process is one rank ------------------------------------------------
def _run_under_torchrun(fn, world_size, args, backend, timeout):
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if size != world_size:
        raise ValueError(f"launch(..., world_size={world_size}) under torchrun with WORLD_SIZE={size}")
    created = not dist.is_initialized()
    if created:
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    try:
        value = fn(rank, size, *args)
        values = [None] * size
        dist.all_gather_object(values, _to_cpu(value))
        return values
    finally:
        if created:
            dist.destroy_process_group()


# -- locally: fork N ranks ------------------------------------------------------------------
def _import_dynamo_once():
    """torch wraps Optimizer.__init__ (and more) in a disable-dynamo decorator whose first call
    imports torch._dynamo and sympy: 2-5 s on a small CPU. Imported here, before forking, every
    rank inherits it; otherwise each rank of each run pays it again (a b06 grading run: 18 times)."""
    import torch._dynamo  # noqa: F401


def _run_forked(fn, world_size, args, backend, timeout, run_timeout):
    """backend None: no process group (in_child). The rendezvous socket is then still bound, unused."""
    # The rendezvous socket is bound here, on a port the OS picks, and rank 0 serves the TCP store
    # on it after the fork: no port race with other runs, and no store thread in this process
    # (a thread that holds a lock while we fork can leave a rank hung before it ever starts).
    _import_dynamo_once()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    ctx = mp.get_context("fork")
    procs, conns = [], []
    try:
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_rank_main, daemon=True, name=f"camplib-rank-{rank}",
                            args=(fn, rank, world_size, args, backend, listener, timeout, child_end, os.getpid()))
            p.start()
            child_end.close()
            procs.append(p)
            conns.append(parent_end)
        listener.close()
        return _collect(procs, conns, run_timeout)
    finally:
        listener.close()
        _end_all(procs)
        for c in conns:
            c.close()


def _collect(procs, conns, run_timeout):
    results: dict[int, object] = {}
    failure: Exception | None = None
    deadline = time.monotonic() + (run_timeout if run_timeout is not None else float("inf"))
    open_conns = dict(enumerate(conns))
    errored: set[int] = set()
    first_raised_at = float("inf")
    while len(results) < len(procs):
        if failure is not None and not open_conns:
            raise failure   # every rank has said its last word (or died): nothing more can come
        left = deadline - time.monotonic()
        if failure is not None:
            left = min(left, failure_deadline - time.monotonic())
        if left <= 0:
            if failure is not None:
                raise failure
            missing = sorted(set(range(len(procs))) - set(results))
            raise RankTimeout(f"ranks {missing} did not finish within run_timeout={run_timeout:g} s "
                              "(an endless loop? a very slow step?); all ranks were ended")
        watch = list(open_conns.values()) + [procs[r].sentinel for r in open_conns if r not in results]
        for ready in wait(watch, timeout=None if left == float("inf") else left):
            rank = next((r for r, c in open_conns.items() if c is ready), None)
            if rank is None:  # a process ended; its last messages may still be in the pipe
                continue
            try:
                kind, payload = pickle.loads(ready.recv_bytes())
            except (EOFError, OSError):
                del open_conns[rank]
                continue
            if kind == "out":
                (sys.stderr if payload[0] == "err" else sys.stdout).write(payload[1])
            elif kind == "ok":
                results[rank] = payload
            elif kind == "error":
                # the cause is the first error raised that is not an echo of another rank's end
                # ("connection closed by peer" once the failed rank closes its connections): a
                # rank's timeout closes them in C++ before its Python stamps the time, so a loaded
                # machine can stamp the echo first. CLOCK_MONOTONIC is one clock for every process.
                *details, raised_at = payload
                errored.add(rank)
                error = RankError(rank, *details)
                if failure is None or (isinstance(failure, RankError) and
                                       (error.echo, raised_at) < (failure.echo, first_raised_at)):
                    if failure is None or failure.echo != error.echo:
                        failure_deadline = time.monotonic() + (ECHO_GRACE_SECONDS if error.echo else GRACE_SECONDS)
                    failure, first_raised_at = error, raised_at
        for r, p in enumerate(procs):
            # a rank that died without a word is the cause of its peers' errors ("connection reset
            # by peer" in a collective), even when one of those reached us first
            if r not in results and r not in errored and r not in open_conns and not p.is_alive() \
                    and not isinstance(failure, RankDied):
                p.join()
                also = "" if failure is None else f" (before that, rank {failure.rank} raised {failure.kind})"
                failure, failure_deadline = RankDied(f"rank {r} died without a result ({_exit_reason(p.exitcode)}); "
                                                     f"all ranks were ended{also}"), time.monotonic()
    if failure is not None:
        raise failure
    return [results[r] for r in range(len(procs))]


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _end_all(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    stop = time.monotonic() + 3.0
    for p in procs:
        p.join(max(0.0, stop - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


class _RankStream:
    """sys.stdout/sys.stderr of a rank: lines go to the launching process, tagged with the rank."""

    def __init__(self, conn, tag: str, which: str):
        self.conn, self.tag, self.which, self.buf = conn, tag, which, ""

    def write(self, text: str) -> int:
        self.buf += text
        if "\n" in self.buf:
            head, _, self.buf = self.buf.rpartition("\n")
            lines = "".join(f"{self.tag}{line}\n" for line in head.split("\n"))
            self.conn.send_bytes(pickle.dumps(("out", (self.which, lines))))
        return len(text)

    def flush(self) -> None:
        if self.buf:
            self.write("\n")

    def isatty(self) -> bool:
        return False


def _die_with_parent(parent: int) -> None:
    """Linux: the kernel kills this rank if the launching process dies (even by SIGKILL)."""
    if sys.platform.startswith("linux"):
        import ctypes
        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # it died before the line above took effect
            os._exit(1)


def _join_group(rank, world_size, backend, listener, timeout) -> None:
    port = listener.getsockname()[1]
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if sys.platform.startswith("linux") and os.path.exists("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # local ranks talk over loopback only
    if backend == "nccl":
        torch.cuda.set_device(rank)
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, wait_for_workers=False,
                          master_listen_fd=listener.fileno() if rank == 0 else None,
                          timeout=timedelta(seconds=timeout))
    if rank != 0:
        listener.close()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))


def _rank_main(fn, rank, world_size, args, backend, listener, timeout, conn, parent) -> None:
    code = 0
    try:
        _die_with_parent(parent)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the notebook ends ranks via the parent
        tag = "" if backend is None else f"[rank {rank}] "
        sys.stdout, sys.stderr = _RankStream(conn, tag, "out"), _RankStream(conn, tag, "err")
        # One intra-op thread per rank, torchrun's default too (OMP_NUM_THREADS=1). More is not
        # safe here: a rank is forked, and if the parent already ran a parallel region, OpenMP
        # (libgomp) hangs in the child's first one (tests/camplib/dist/test_launch.py).
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
        if backend is not None:
            _join_group(rank, world_size, backend, listener, timeout)
        value = fn(rank, world_size, *args)
        sys.stdout.flush()
        sys.stderr.flush()
        message = ("ok", _to_cpu(value))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        code = 1
        message = ("error", (type(exc).__name__, str(exc), "".join(traceback.format_exception(exc)), time.monotonic()))
    try:
        data = pickle.dumps(message)
    except Exception as exc:  # noqa: BLE001
        code = 1
        data = pickle.dumps(("error", ("TypeError", f"the return value cannot be sent back: {exc}", "",
                                       time.monotonic())))
    try:
        conn.send_bytes(data)
        conn.close()
    except OSError:
        pass
    if code == 0 and backend is not None:
        # Stay alive until the launching process ends us: a peer still inside a collective then
        # sees its real error (a timeout) rather than "connection closed by peer".
        while True:
            time.sleep(3600)
    # Skip the parent's atexit handlers and the process group's teardown (which can block on
    # peers that failed): the launching process ends whatever is left.
    os._exit(code)


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value
