"""The runtime half of the forbidden-API check, inside the student's process: what ran there,
whatever name it used, whichever thread or forked child ran it, whoever's frames called it.

Whatever runs in the student's process is the student's answer: the course's own helpers that
the grader runs there (`make` targets, `checks.forward_backward`), a course function the student
assigned to an exercise's name, a callable they handed to one of those helpers. So no call is
exempt by frame or module; the grader decides which reports count (those that arrive while one
of its tests runs, autograder.grading.engine).

Two layers, both process-wide and armed before any of the student's code runs:
- `Tripwires` (autograder.grading.tripwires) on the forbidden Python names of libraries (torch,
  peft, ...: `runtime_entries`). The course's own modules (camplib) are not wired: the static
  scan sees every name that reaches them, and the course's runners that a test starts in this
  process (camplib.parallel.context.run, zero.run, ...) build on them;
- kernels at the operator dispatcher (`torch.library`) for every aten operator that implements a
  forbidden entry (`ops_for`): on every backend key with a kernel, and on the composite key of
  operators that decompose before reaching a backend (sdpa's math path). Each reports, then calls
  the kernel it replaced with the same dispatch keys, so results are bit for bit torch's own.
  The dispatcher is one table for the process: every thread and thread pool, every forked child
  or process pool (fork copies it), operators the student registers with `torch.library` that
  call aten operators, a direct `redispatch` to a backend key: all reach these kernels.
  (No new interpreter starts: the sandbox refuses `execve`, autograder.isolation.seccomp.)

In the ranks the grader starts for a distributed test (autograder.grading.rank_pool) a third
layer reports every torch.distributed collective (`wire_collectives`: wrappers on the methods of
c10d's ProcessGroup, which every `dist.*` collective calls, and of its Backend, which a direct call
on the backend object reaches): not forbidden, but what the grader itself saw a rank call, so that
"the ring uses point-to-point messages only" is checked on its side (`RankPool.run`'s
"collectives"), with canaries on a one-rank group of the process's own (`collective_plan`).
Wrappers, not kernels on the `c10d` operators: a Python kernel holds the GIL while gloo's enqueue
waits for its work queue, whose worker thread may need the GIL to free a finished tensor, a
deadlock (seen in a03's ranks); the bound methods release the GIL as torch's own calls do. The
operators' Python names (`torch.ops.c10d.allreduce_`, `torch.ops._c10d_functional.all_reduce`)
report through proxies on their namespaces (autograder.grading.collective_ops), Python calls in
front of torch's own in the same way. Not seen: C++ that calls a collective itself (DDP's Reducer,
`dist._broadcast_coalesced`) and the originals reached past these wrappers (`__closure__`, gc),
or fresh operators from torch's private constructors: the static scan refuses those names.

Every hit is written at once to `Reporter`'s socket, whose other end only the trusted grader
holds: inherited by forked children, it cannot be read back from this side (a socket, unlike a
pipe, cannot be reopened through /proc), so a report cannot be taken back. The grader sends
canaries (`canary_plan`) after each test and requires every planned report to arrive: a closed,
replaced or flooded socket, or a layer removed, fails the test as tampering. The static scan
(forbid.py) is the primary check.
"""
from __future__ import annotations

import socket
import warnings
from functools import lru_cache

import torch

from .collective_ops import OP_ENTRIES, OPS_PREFIX, op_canary, wire_ops
from .entries import Rules, alias_of, resolve, rules_for
from .tripwires import Tripwires

CANARY_FILE = "<camp canary>"
MAX_REPORT = 4096   # bytes of one report: one atomic message
RUNTIME_KEY_PREFIXES = ("", "Sparse", "SparseCsr", "Quantized", "NestedTensor")
RUNTIME_BACKENDS = ("CPU", "CUDA", "XPU", "MPS", "HPU", "PrivateUse1")


def runtime_entries(forbid) -> list[str]:
    """The entries the runtime tripwires watch (and the canaries check): all but the course's own."""
    return [e for e in forbid if e.split(".")[0] != "camplib"]


@lru_cache(maxsize=32)
def ops_for(forbid: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """aten operator name -> forbidden entries it implements (`_softmax`, `_safe_softmax` ->
    the softmax entries; `_scaled_dot_product_flash_attention_for_cpu` -> sdpa). Only the
    entries wired at run time (`runtime_entries`, not camplib's): a camplib module the lab's
    sandbox leaves out (autograder.isolation.course_tree) does not import there, so it would
    read as a function whose name aliases operators (`camplib.attention.softmax` -> `aten::_softmax`)."""
    rules = rules_for(forbid)
    names = {n.split("::", 1)[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")}
    mapping: dict[str, tuple[str, ...]] = {}
    for op in sorted(names):
        entries = tuple(e for e in runtime_entries(rules.callables) if alias_of(op, e))
        if entries:
            mapping[op] = entries
    return mapping


# the collectives, as c10d names their operators (ProcessGroup's methods without the "_": every torch.distributed
# collective, dispatch to them); a barrier is the course's own (camplib.dist.separate.join_and_run)
COLLECTIVE_OPS = ("allreduce_", "allreduce_coalesced_", "broadcast_", "reduce_", "allgather_", "_allgather_base_",
                  "allgather_coalesced_", "allgather_into_tensor_coalesced_", "reduce_scatter_",
                  "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_", "alltoall_", "alltoall_base_",
                  "gather_", "scatter_")
# the same collectives called on a backend object directly (ProcessGroupGloo's methods, which
# skip the dispatcher): a Python wrapper on their class, c10d's Backend
BACKEND_METHODS = ("allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather", "_allgather_base",
                   "allgather_coalesced", "reduce_scatter", "_reduce_scatter_base", "alltoall", "alltoall_base",
                   "gather", "scatter")
BACKEND_PREFIX = "c10d.Backend."
# ProcessGroup's newer names for the same operators (what `dist.all_gather_into_tensor`,
# `reduce_scatter_tensor` and `all_to_all_single` call in torch >= 2.12)
SINGLE_ALIASES = {"all_gather_single": "_allgather_base_", "reduce_scatter_single": "_reduce_scatter_base_",
                  "all_to_all_single": "alltoall_base_",
                  "all_gather_single_coalesced": "allgather_into_tensor_coalesced_",
                  "reduce_scatter_single_coalesced": "reduce_scatter_tensor_coalesced_"}
COLLECTIVE_ENTRIES = tuple("c10d::" + op for op in COLLECTIVE_OPS) + tuple(BACKEND_PREFIX + m for m in BACKEND_METHODS) \
    + OP_ENTRIES   # the operators by their Python names, torch.ops.c10d.allreduce_ (collective_ops)


def collective_name(entry: str) -> str:
    """"c10d::_allgather_base_" or "c10d.Backend._allgather_base" -> "_allgather_base": the
    ProcessGroup method's name (camplib.dist.counting's names); "ops._c10d_functional::all_reduce"
    -> "_c10d_functional::all_reduce" (an operator of another namespace keeps it)."""
    return entry.removeprefix(OPS_PREFIX).removeprefix(BACKEND_PREFIX).removeprefix("c10d::").removesuffix("_")


@lru_cache(maxsize=1)
def collective_plan() -> tuple[tuple[str, str, int], ...]:
    """A canary for every watched collective, each layer (ProcessGroup's and Backend's run on a
    one-rank group of the rank's own; an operator's is a call that torch refuses after the report),
    the operators this torch has."""
    return tuple((entry, "backend" if entry.startswith(BACKEND_PREFIX) else "op" if entry.startswith(OPS_PREFIX)
                  else "collective", 0) for entry in COLLECTIVE_ENTRIES
                 if not entry.startswith(OPS_PREFIX) or _has_op(entry))


def _has_op(entry: str) -> bool:
    import torch.distributed  # noqa: F401  (registers the c10d operators)
    ns, op = entry.removeprefix(OPS_PREFIX).split("::")
    return torch._C._dispatch_has_kernel(f"{ns}::{op}")


# -- reporting ----------------------------------------------------------------------------------

def report_channel() -> tuple[socket.socket, socket.socket]:
    """(the grader's end, the student's end): a datagram-like socket pair, one report a message."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


class Reporter:
    """The student side of the channel: `report(entries)` sends one message, never blocking (a
    full channel already holds reports: a dropped one changes no grade)."""

    def __init__(self, fd: int | None):
        self.sock = socket.socket(fileno=fd) if fd is not None else None

    def __call__(self, entries) -> None:
        if self.sock is None:
            return
        try:
            self.sock.send("\n".join(entries).encode()[:MAX_REPORT], socket.MSG_DONTWAIT)
        except OSError:
            pass   # closed or replaced by the student's code: the canaries will not arrive


def read_reports(sock: socket.socket, known, limit: int = 100000) -> tuple[set[str], bool]:
    """(entries reported, whether every message was a well-formed report of `known` entries and
    the student's end is still open) from the grader's end, without blocking: what arrived since
    the last read."""
    entries: set[str] = set()
    clean = True
    for _ in range(limit):
        try:
            data = sock.recv(MAX_REPORT + 1, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            break
        except OSError:
            return entries, False
        if not data:
            return entries, False   # the student's end was closed, everywhere
        try:
            entries.update(data.decode("utf-8").split("\n"))
        except UnicodeDecodeError:
            clean = False
    unknown = entries - set(known)
    return entries - unknown, clean and not unknown


# -- the dispatcher layer -----------------------------------------------------------------------

@lru_cache(maxsize=1)
def _runtime_keys() -> tuple[str, ...]:
    keys = []
    for prefix in RUNTIME_KEY_PREFIXES:
        for backend in RUNTIME_BACKENDS:
            try:
                torch._C._dispatch_has_computed_kernel_for_dispatch_key("aten::add.Tensor", prefix + backend)
            except RuntimeError:
                continue
            keys.append(prefix + backend)
    return tuple(keys)


def _kernel(original, message: tuple[str, ...], report):
    def kernel(keyset, *args, **kwargs):
        report(message)
        return original.call_boxed(keyset, *args, **kwargs)
    return kernel


def arm_dispatcher(ops: dict[str, tuple[str, ...]], report) -> torch.library.Library | None:
    """Report-then-original kernels for `ops` in this process's dispatcher (see the module's
    docstring). Keep the returned library alive: dropping it restores torch's own kernels."""
    if not ops:
        return None
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():   # "overriding a previously registered kernel": on purpose
        warnings.simplefilter("ignore")
        for op, entries in ops.items():
            for overload in getattr(torch.ops.aten, op).overloads():
                name = op if overload == "default" else f"{op}.{overload}"
                qualified = "aten::" + name
                composite = torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CompositeImplicitAutograd")
                if composite:
                    # decomposes above the backends: one kernel for every key, around the original
                    # (a backend kernel of its own would take autograd's place: never added)
                    original = torch.library.get_kernel(qualified, "AutogradCPU")
                    lib.impl(name, _kernel(original, entries, report), "CompositeImplicitAutograd", with_keyset=True)
                for key in _runtime_keys():
                    if (torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key) if composite
                            else torch._C._dispatch_has_computed_kernel_for_dispatch_key(qualified, key)):
                        original = torch.library.get_kernel(qualified, key)
                        lib.impl(name, _kernel(original, entries, report), key, with_keyset=True)
    return lib


def _reporting(original, message: tuple[str, ...], report):
    """The method `original`, reporting `message` first. The original lives in the closure only
    (not a default argument, which `inspect.signature` or `__kwdefaults__` would hand out)."""
    def wrapper(self, *args, **kwargs):
        report(message)
        return original(self, *args, **kwargs)
    return wrapper


def _wire(cls, methods: tuple[str, ...], entries: tuple[str, ...], report) -> None:
    for method, entry in zip(methods, entries):
        setattr(cls, method, _reporting(getattr(cls, method), (entry,), report))


def wire_collectives(report) -> None:
    """Report-then-original wrappers on ProcessGroup's collective methods (COLLECTIVE_OPS, reported
    as "c10d::<op>"), on Backend's (BACKEND_METHODS) and on the c10d operators' Python names
    (collective_ops), for the life of this process."""
    from torch._C._distributed_c10d import Backend, ProcessGroup
    _wire(ProcessGroup, tuple(op.removesuffix("_") for op in COLLECTIVE_OPS),
          COLLECTIVE_ENTRIES[:len(COLLECTIVE_OPS)], report)
    _wire(Backend, BACKEND_METHODS, COLLECTIVE_ENTRIES[len(COLLECTIVE_OPS):], report)
    aliases = {name: "c10d::" + op for name, op in SINGLE_ALIASES.items() if hasattr(ProcessGroup, name)}
    _wire(ProcessGroup, tuple(aliases), tuple(aliases.values()), report)
    wire_ops(report)


def _solo_group():
    """A one-rank gloo group of this process's own (no store to join, no default group needed)."""
    from torch._C._distributed_c10d import HashStore, ProcessGroup, ProcessGroupGloo
    store = HashStore()
    group = ProcessGroup(store, 0, 1)
    group._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, ProcessGroupGloo(store, 0, 1))
    group._set_default_backend(ProcessGroup.BackendType.GLOO)
    return group


def _collective_canary(group, entry: str, x: torch.Tensor) -> None:
    """Call the collective `entry` on a one-rank `group` through ProcessGroup (hence its c10d operator)."""
    out = torch.empty_like(x)
    calls = {"allreduce_": lambda: group.allreduce([x]), "allreduce_coalesced_": lambda: group.allreduce_coalesced([x]),
             "broadcast_": lambda: group.broadcast([x]), "reduce_": lambda: group.reduce([x]),
             "allgather_": lambda: group.allgather([[out]], [x]),
             "_allgather_base_": lambda: group._allgather_base(out, x),
             "allgather_coalesced_": lambda: group.allgather_coalesced([[out]], [x]),
             "allgather_into_tensor_coalesced_": lambda: group.allgather_into_tensor_coalesced([out], [x]),
             "reduce_scatter_": lambda: group.reduce_scatter([out], [[x]]),
             "_reduce_scatter_base_": lambda: group._reduce_scatter_base(out, x),
             "reduce_scatter_tensor_coalesced_": lambda: group.reduce_scatter_tensor_coalesced([out], [x]),
             "alltoall_": lambda: group.alltoall([out], [x]), "alltoall_base_": lambda: group.alltoall_base(out, x, [], []),
             "gather_": lambda: group.gather([[out]], [x]), "scatter_": lambda: group.scatter([out], [[x]])}
    calls[entry.removeprefix("c10d::") if entry.startswith("c10d::") else entry.removeprefix(BACKEND_PREFIX) + "_"]().wait()


class Observer:
    """Both layers for one lab's forbidden list, armed for the life of this process (and, with
    `collectives`, the collectives' layer of a rank's sandbox)."""

    def __init__(self, forbid: list[str], report, collectives: bool = False):
        self.report = report
        self.tripwires = Tripwires(runtime_entries(forbid), report)
        self.library = arm_dispatcher(ops_for(tuple(forbid)), report)
        if collectives:
            wire_collectives(report)
        self._group = None

    def canary(self, plan: list, seed: int) -> None:
        """Run each planned canary call as the student's code would; the reports they make go to
        the grader on the channel (nothing this process says about them is believed)."""
        for entry, way, index in plan:
            try:
                if way == "op":
                    op_canary(entry)
                    continue
                if way in ("collective", "backend"):
                    self._group = self._group or _solo_group()
                    target = self._group if way == "collective" else self._group._get_backend(torch.device("cpu"))
                    _collective_canary(target, entry, canary_args(0, seed)[0].clone())
                    continue
                fn = _canary_target(entry, way, self.tripwires)
                _canary_call(fn, canary_args(index, seed))
            except Exception:
                pass


def _canary_target(entry: str, way: str, tripwires: Tripwires):
    if way == "dispatch":   # the original function, past any Python wrapper: only the dispatcher sees it
        return tripwires.originals.get(entry) or resolve.__wrapped__(entry)
    return resolve.__wrapped__(entry)  # as the student would name it now (not the cached one)


def canary_args(index: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 4, generator=g)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=g) for _ in range(3))
    p = torch.nn.Parameter(torch.randn(4, generator=g))
    p.grad = torch.randn(4, generator=g)
    return [(x, -1), (x,), (q, k, v), (x, (4,)), ([p], 1.0), ([p],), (4, 2), ()][index]


N_CANDIDATES = 8
_CANARY_CODE = compile("result = fn(*args)", CANARY_FILE, "exec")


def _canary_call(fn, args):
    namespace = {"fn": fn, "args": args}
    exec(_CANARY_CODE, namespace)
    return namespace["result"]


class _OpsReached(torch.utils._python_dispatch.TorchDispatchMode):
    """For planning canaries in the trusted process only (which never arms the dispatcher): the
    forbidden entries whose aten operators a call reaches below autograd."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False   # no dynamo import (~2 s) for planning

    def __init__(self, ops: dict[str, tuple[str, ...]]):
        super().__init__()
        self.ops, self.hits = ops, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "aten":
            self.hits.update(self.ops.get(func.__name__.split(".")[0], ()))
        return func(*args, **(kwargs or {}))


@lru_cache(maxsize=32)
def canary_plan(forbid: tuple[str, ...]) -> tuple[tuple[str, str, int], ...]:
    """(entry, way, argument set) for each canary the grader requires after a test, decided in
    the trusted process: an entry's first argument set that runs (and, for the dispatch way,
    reaches one of its operators). Classes and functions get a "name" canary (the Python
    tripwire); functions with operators also a "dispatch" one."""
    rules: Rules = rules_for(forbid)
    ops = ops_for(forbid)
    entries_with_ops = {e for es in ops.values() for e in es}
    plan = []
    for entry in runtime_entries(rules.callables):
        fn = resolve(entry)
        if fn is None or not callable(fn):
            continue
        for index in range(N_CANDIDATES):
            try:   # a trial call's deprecation warning is noise on the grader's terminal
                with _OpsReached(ops) as mode, warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _canary_call(fn, canary_args(index, 0))
            except Exception:
                continue
            if entry in entries_with_ops and entry not in mode.hits:
                continue
            plan.append((entry, "name", index))
            if entry in entries_with_ops:
                plan.append((entry, "dispatch", index))
            break
    return tuple(plan)


def arm(forbid: list[str], report_fd: int | None, collectives: bool = False) -> Observer:
    """The student process's observer, reporting on the inherited descriptor `report_fd`."""
    return Observer(forbid, Reporter(report_fd), collectives)


__all__ = ["COLLECTIVE_ENTRIES", "Observer", "Reporter", "arm", "arm_dispatcher", "canary_plan",
           "collective_name", "collective_plan", "ops_for", "read_reports", "report_channel", "wire_collectives"]
