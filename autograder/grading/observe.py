"""The runtime half of the forbidden-API check, inside the student's process: what their code
actually called, whatever name it used.

Two layers: `Tripwires` (autograder.grading.forbid) on the forbidden Python names, and a
TorchDispatchMode that sees every aten operator, so `torch.ops.aten._softmax`,
`torch._C._nn.scaled_dot_product_attention` or a Tensor method all land on the operators the
forbidden entry maps to (`ops_for`). A hit counts only when the innermost caller outside torch
and the standard library is the student's code, never camplib's or the grader's own.

This process belongs to the student, so nothing here is trusted on its own: the grader sends
canaries (`canary_plan`) after each test and requires every armed layer to report them; a
missing canary means the observer was tampered with. The static scan (forbid.py) is the
primary check.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import warnings
from functools import lru_cache

import torch

from .forbid import Rules, Tripwires, _resolve, _rules, alias_of

CANARY_FILE = "<camp canary>"   # a frame that counts as the student's, like their own cells


@lru_cache(maxsize=1)
def _dirs() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(pass-through: torch, the standard library, installed packages and the observer's own
    wrappers; the course's own code: camplib and the grader)."""
    paths = sysconfig.get_paths()
    through = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    through.add(os.path.dirname(torch.__file__))
    import autograder
    import camplib
    course = {os.path.dirname(autograder.__file__), os.path.dirname(camplib.__file__)}
    here = os.path.dirname(os.path.abspath(__file__))
    ours = (os.path.join(here, "forbid.py"), os.path.join(here, "observe.py"))
    return tuple(os.path.join(p, "") for p in through) + ours, tuple(os.path.join(p, "") for p in course)


def called_by_student(depth: int = 2) -> bool:
    """True when the innermost frame outside torch/stdlib/installed packages (starting `depth`
    frames up) is the student's code: a cell, a file of theirs, exec'd text, a canary."""
    through, course = _dirs()
    frame = sys._getframe(depth)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(through) or name.startswith("<frozen"):
            frame = frame.f_back
            continue
        return not name.startswith(course)
    return False


@lru_cache(maxsize=32)
def ops_for(forbid: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """aten operator name -> forbidden entries it implements (`_softmax`, `_safe_softmax` ->
    the softmax entries; `_scaled_dot_product_flash_attention_for_cpu` -> sdpa)."""
    rules = _rules(forbid)
    names = {n.split("::", 1)[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")}
    mapping: dict[str, tuple[str, ...]] = {}
    for op in sorted(names):
        entries = tuple(e for e in rules.callables if alias_of(op, e))
        if entries:
            mapping[op] = entries
    return mapping


class _OpObserver(torch.utils._python_dispatch.TorchDispatchMode):
    """Notes every aten operator the student's code reaches that implements a forbidden entry."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch would wrap __torch_dispatch__ in its disable-dynamo decorator, whose first call
        # imports torch._dynamo and sympy: ~2 s in every student process. We keep dynamo out of
        # the observer ourselves, and only once something has imported it (torch.compile does).
        return False

    def __init__(self, ops: dict[str, tuple[str, ...]], hits: set[str]):
        super().__init__()
        self.ops, self.hits = ops, hits
        self.seen: dict[object, tuple[str, ...]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "torch._dynamo" in sys.modules:      # compiling may be under way: never traced
            return (_OUTSIDE_DYNAMO or _observe_outside_dynamo())(self, func, args, kwargs)
        return self._observe(func, args, kwargs)

    def _observe(self, func, args, kwargs):
        entries = self.seen.get(func)
        if entries is None:
            entries = self.seen[func] = self.ops.get(func.__name__.split(".")[0], ()) if func.namespace == "aten" else ()
        if entries and called_by_student():
            self.hits.update(entries)
        return func(*args, **(kwargs or {}))


_OUTSIDE_DYNAMO = None


def _observe_outside_dynamo():
    global _OUTSIDE_DYNAMO
    import torch._dynamo
    _OUTSIDE_DYNAMO = torch._dynamo.disable(_OpObserver._observe, recursive=True)
    return _OUTSIDE_DYNAMO


class Observer:
    """Both layers for one lab's forbidden list; `hits` collects what one request called."""

    def __init__(self, forbid: list[str]):
        self.tripwires = Tripwires(forbid)
        self.hits = self.tripwires.hits
        self.ops = ops_for(tuple(forbid))
        self.mode = _OpObserver(self.ops, self.hits) if self.ops else None
        self.intact = True

    def reset(self) -> None:
        self.hits.clear()

    def run(self, fn, *args):
        """fn(*args) with the dispatch layer watching; notes if the student's code removed it."""
        if self.mode is None:
            return fn(*args)
        from torch.utils._python_dispatch import _get_current_dispatch_mode
        self.mode.__enter__()
        try:
            return fn(*args)
        finally:
            if _get_current_dispatch_mode() is not self.mode:
                self.intact = False
            try:
                self.mode.__exit__(None, None, None)
            except Exception:
                self.intact = False

    def canary(self, plan: list, seed: int) -> list[bool]:
        """Run each planned canary call as the student's code would; which ones were seen."""
        seen = []
        for entry, way, index in plan:
            self.reset()
            try:
                fn = _canary_target(entry, way, self.tripwires)
                self.run(_canary_call, fn, canary_args(index, seed))
            except Exception:
                pass
            seen.append(entry in self.hits)
        self.reset()
        return seen


def _canary_target(entry: str, way: str, tripwires: Tripwires):
    if way == "dispatch":   # the original function, past any Python wrapper: only the dispatch layer sees it
        return tripwires.originals.get(entry) or _resolve.__wrapped__(entry)
    return _resolve.__wrapped__(entry)  # as the student would name it now (not the cached one)


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


@lru_cache(maxsize=32)
def canary_plan(forbid: tuple[str, ...]) -> tuple[tuple[str, str, int], ...]:
    """(entry, way, argument set) for each canary the grader requires after a test, decided in
    the trusted process: an entry's first argument set that runs (and, for the dispatch way,
    reaches one of its operators). Classes and functions get a "name" canary (the Python
    tripwire); functions with operators also a "dispatch" one."""
    rules: Rules = _rules(forbid)
    ops = ops_for(forbid)
    entries_with_ops = {e for es in ops.values() for e in es}
    plan = []
    for entry in rules.callables:
        fn = _resolve(entry)
        if fn is None or not callable(fn):
            continue
        for index in range(N_CANDIDATES):
            hits: set[str] = set()
            try:   # a trial call's deprecation warning is noise on the grader's terminal
                with _OpObserver(ops, hits), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    _canary_call(fn, canary_args(index, 0))
            except Exception:
                continue
            if entry in entries_with_ops and entry not in hits:
                continue
            plan.append((entry, "name", index))
            if entry in entries_with_ops:
                plan.append((entry, "dispatch", index))
            break
    return tuple(plan)
