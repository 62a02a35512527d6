"""The one checking helper behind every lab's tests.

Lab test cells never use bare asserts: they call these functions with a *name* for the value
under test. That keeps the student-facing messages uniform (the tensor, the worst element, the
max difference, the tolerance used) and gives the grader one place to change how comparisons
are made (for instance, to compare outside the student's interpreter).

Tolerances are per dtype (see `TOLERANCES`); a check may tighten or loosen them explicitly.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["TOLERANCES", "tolerance", "check_close", "check_equal", "check_shape", "check_true", "check_finite",
           "forward_backward", "load_parameters", "parameters_of", "make", "case", "loopback_traffic",
           "separate_ranks"]

# (atol, rtol) used when a check does not state its own. Chosen for results of a few dozen
# floating point operations on values of order 1: fp64 keeps ~15 digits, fp32 ~7, bf16 ~3.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-5, 1e-4),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1e-2),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(atol, rtol) for comparing tensors of `dtype`; exact (0, 0) for integers and bools."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def _as_tensor(name: str, value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    try:
        return torch.as_tensor(value)
    except Exception as exc:  # a student returned None, a string, a module...
        raise AssertionError(f"{name}: expected a tensor, got {type(value).__name__} ({exc})") from None


def check_shape(name: str, actual: Any, shape: tuple[int, ...]) -> None:
    """Fail with a message naming `name` unless `actual` has exactly `shape`."""
    got = tuple(_as_tensor(name, actual).shape)
    if got != tuple(shape):
        raise AssertionError(f"{name}: shape {got}, expected {tuple(shape)}")


def check_finite(name: str, actual: Any) -> None:
    """Fail unless every element of `actual` is finite (no NaN, no inf)."""
    t = _as_tensor(name, actual)
    if t.is_floating_point() and not torch.isfinite(t).all():
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        n_bad = int((~torch.isfinite(t)).sum())
        raise AssertionError(f"{name}: {n_bad} non-finite value(s), first at index {tuple(bad)}: {t[tuple(bad)].item()}")


def check_close(name: str, actual: Any, expected: Any, *, atol: float | None = None,
                rtol: float | None = None, check_dtype: bool = True) -> None:
    """Fail unless |actual - expected| <= atol + rtol * |expected| everywhere.

    The message names the tensor, the max absolute difference, where it occurs and the
    tolerance used, so a student can tell "slightly off" from "completely wrong".
    NaN matches NaN only where both are NaN.
    """
    a = _as_tensor(name, actual)
    e = _as_tensor(f"expected {name}", expected)
    if tuple(a.shape) != tuple(e.shape):
        raise AssertionError(f"{name}: shape {tuple(a.shape)}, expected {tuple(e.shape)}")
    if check_dtype and a.dtype != e.dtype:
        raise AssertionError(f"{name}: dtype {a.dtype}, expected {e.dtype}")
    d_atol, d_rtol = tolerance(e.dtype)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    a64, e64 = a.to(torch.float64).cpu(), e.to(torch.float64).cpu()
    nan_a, nan_e = torch.isnan(a64), torch.isnan(e64)
    if not torch.equal(nan_a, nan_e):
        where = (nan_a != nan_e).nonzero()[0].tolist()
        raise AssertionError(f"{name}: NaN pattern differs, first at index {tuple(where)} "
                             f"(got {a64[tuple(where)].item()}, expected {e64[tuple(where)].item()})")
    both = nan_a & nan_e
    diff = (a64 - e64).abs().masked_fill(both, 0.0)
    # inf == inf is fine, inf vs finite is an infinite difference
    same_inf = torch.isinf(a64) & (a64 == e64)
    diff = diff.masked_fill(same_inf, 0.0)
    allowed = atol + rtol * e64.abs().masked_fill(both | same_inf, 0.0)
    bad = diff > allowed
    if bad.any():
        max_diff = diff.max().item()
        idx = tuple(torch.unravel_index(diff.argmax(), diff.shape)) if diff.dim() else ()
        idx = tuple(int(i) for i in idx)
        first = tuple(int(i) for i in bad.nonzero()[0]) if bad.dim() else ()
        raise AssertionError(
            f"{name}: max |difference| = {max_diff:.3g} at index {idx} "
            f"(got {a64[idx].item():.6g}, expected {e64[idx].item():.6g}); "
            f"{int(bad.sum())} of {bad.numel()} elements outside atol={atol:g}, rtol={rtol:g}; "
            f"first at index {first} (got {a64[first].item():.6g}, expected {e64[first].item():.6g})")


@contextmanager
def case(index: Any, *, seed: int | None = None, shape: Any = None, dtype: Any = None, **details: Any):
    """Name a hidden case in every check failure inside the block, so a student can rebuild it:

        with case(3, seed=seed, shape=x.shape, dtype=x.dtype, dim=dim):
            check_close("softmax(x)", softmax(x, dim), torch.softmax(x, dim))

    fails with "hidden case 3 (seed 123, shape (2, 5, 7), float64, dim=1): softmax(x): ...".
    Any other exception escaping the block is reported the same way (as a failed check)."""
    parts = [f"seed {seed}"] if seed is not None else []
    if shape is not None:
        parts.append(f"shape {tuple(int(n) for n in shape)}")
    if dtype is not None:
        parts.append(str(dtype).removeprefix("torch."))
    parts += [f"{key}={value}" for key, value in details.items()]
    label = f"hidden case {index}" + (f" ({', '.join(parts)})" if parts else "")
    try:
        yield label
    except AssertionError as exc:
        raise AssertionError(f"{label}: {exc}") from None
    except Exception as exc:  # the student's code raised or returned something unusable
        raise AssertionError(f"{label}: {type(exc).__name__}: {exc}") from None


def check_equal(name: str, actual: Any, expected: Any) -> None:
    """Fail unless `actual` equals `expected` exactly (tensors element-wise, else ==)."""
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        a, e = _as_tensor(name, actual), _as_tensor(f"expected {name}", expected)
        if tuple(a.shape) != tuple(e.shape):
            raise AssertionError(f"{name}: shape {tuple(a.shape)}, expected {tuple(e.shape)}")
        if a.dtype != e.dtype:
            raise AssertionError(f"{name}: dtype {a.dtype}, expected {e.dtype}")
        if not torch.equal(a.cpu(), e.cpu()):
            idx = tuple(int(i) for i in (a.cpu() != e.cpu()).nonzero()[0])
            n = int((a.cpu() != e.cpu()).sum())
            raise AssertionError(f"{name}: {n} of {a.numel()} elements differ, first at index {idx} "
                                 f"(got {a[idx].item()}, expected {e[idx].item()})")
        return
    if type(actual) is not type(expected) or actual != expected:
        raise AssertionError(f"{name}: got {actual!r}, expected {expected!r}")


def check_true(name: str, condition: Any, hint: str = "") -> None:
    """Fail with `name` and a hint unless `condition` is exactly True (not merely truthy)."""
    if isinstance(condition, torch.Tensor):
        condition = bool(condition.all().item())
    if condition is not True:
        raise AssertionError(f"{name}: check failed" + (f" ({hint})" if hint else ""))


# -- running student code: the same calls work on local objects and, during grading, on the
#    stand-ins for objects that live in the student's process (autograder.grading.remote) -------------

def _remote(obj) -> bool:
    return type(obj).__name__ == "RemoteObject" and type(obj).__module__ == "autograder.grading.remote"


def forward_backward(fn: Any, *inputs: Any, grad_output: torch.Tensor | None = None, **kwargs: Any):
    """Run `fn(*inputs, **kwargs)` on fresh leaf copies of the floating-point tensor inputs and
    backpropagate `grad_output` (ones when None).

    Returns (output, input_grads, parameter_grads): input_grads is a tuple with one entry per
    input (None where there is no gradient), parameter_grads a dict for an nn.Module `fn`.
    Tests use this instead of calling .backward() themselves so that gradients can be checked
    wherever the student's code runs.
    """
    if _remote(fn):
        return tuple(fn._forward_backward(inputs, kwargs, grad_output))
    leaves = [x.detach().clone().requires_grad_(True) if isinstance(x, torch.Tensor) and x.is_floating_point()
              else x for x in inputs]
    if isinstance(fn, torch.nn.Module):
        fn.zero_grad(set_to_none=True)
    out = fn(*leaves, **kwargs)
    if not isinstance(out, torch.Tensor):
        raise AssertionError(f"forward_backward: expected a tensor output, got {type(out).__name__}")
    if not out.requires_grad:
        raise AssertionError("forward_backward: the output does not depend on any input or parameter "
                             "through autograd (detached, or computed without torch operations?)")
    out.backward(torch.ones_like(out) if grad_output is None else grad_output)
    grads = tuple(x.grad if isinstance(x, torch.Tensor) and x.requires_grad else None for x in leaves)
    params = ({n: p.grad.detach().clone() for n, p in fn.named_parameters() if p.grad is not None}
              if isinstance(fn, torch.nn.Module) else {})
    return out.detach(), grads, params


def load_parameters(module: Any, params: dict[str, torch.Tensor]) -> None:
    """Copy `params` (name -> tensor) into `module`'s parameters of the same names and shapes."""
    if _remote(module):
        module._load_parameters(params)
        return
    named = dict(module.named_parameters())
    for name, value in params.items():
        if name not in named:
            raise AssertionError(f"{type(module).__name__} has no parameter '{name}' "
                                 f"(it has: {', '.join(named) or 'none'})")
        if tuple(named[name].shape) != tuple(value.shape):
            raise AssertionError(f"parameter '{name}': shape {tuple(named[name].shape)}, expected {tuple(value.shape)}")
        with torch.no_grad():
            named[name].copy_(value)


def parameters_of(module: Any) -> dict[str, torch.Tensor]:
    """name -> detached copy of every parameter of `module`."""
    if _remote(module):
        return dict(module._parameters())
    return {n: p.detach().clone() for n, p in module.named_parameters()}


# Set by the grader while it runs a test cell: objects `make` builds then live in the student's
# process, next to the student's code that will use them.
_grading_session = None
MAKE_ALLOWED = ("camplib.", "torch.")      # prefixes
MAKE_ALLOWED_EXACT = ("os.listdir",)        # for tests that look at files the student's code wrote


def make_allowed(path: str) -> bool:
    return isinstance(path, str) and (path.startswith(MAKE_ALLOWED) or path in MAKE_ALLOWED_EXACT)


def make(path: str, *args: Any, **kwargs: Any):
    """Build `path(*args, **kwargs)` (a class or factory from the course library or torch, e.g.
    "camplib.model.GPT") where the student's code runs: here in the notebook, and in the
    student's process during grading. Use it for objects a test hands to the student's code
    (a model for their generate(), parameters for their optimizer)."""
    if not make_allowed(path):
        raise ValueError(f"make: {path!r} is not in {MAKE_ALLOWED + MAKE_ALLOWED_EXACT}")
    if _grading_session is not None:
        return _grading_session.make(path, args, kwargs)
    import importlib
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)



def separate_ranks(path: str, fn: Any, per_rank: list, timeout: float = 30.0) -> dict:
    """Run the course's rank function `path` ("camplib.dist.harness.collective_rank")
    as `rank_fn(rank, world_size, fn, per_rank[rank])` on len(per_rank) ranks, each a process
    that receives only its own `per_rank[rank]`; camplib.dist.on_ranks' format comes back, plus
    "collectives" (per rank, the torch.distributed collectives it called: in grading, what the
    grader's observer saw, not the rank's own count).
    During grading the grader starts each rank in a sandbox of its own whose only channel to the
    others is the loopback network (autograder.grading.rank_pool): correct outputs that need
    every rank's input prove that data travelled, whatever the student's process reports. In the
    notebook the ranks are forked here (camplib.dist.separate)."""
    if _grading_session is not None:
        return _grading_session.separate_ranks(path, fn, list(per_rank), timeout)
    from camplib.dist.separate import on_separate_ranks
    return on_separate_ranks(path, fn, list(per_rank), timeout=timeout)


class Traffic:
    """What `loopback_traffic` measured: `sent`, bytes (payload and headers) put on the loopback
    interface while its block ran; set when the block ends."""
    sent: int = 0


@contextmanager
def loopback_traffic():
    """Count the bytes sent over the loopback network while the block runs, as the kernel counts
    them where the student's code runs:

        with loopback_traffic() as wire:
            out = make("camplib.dist.harness.run_collective", ring_all_reduce, inputs)
        check_true("...", wire.sent >= sum(out["bytes_sent"]))

    During grading the count is read by the grader, outside the student's process, from the
    sandbox's own network namespace (nothing else talks there): ranks that really exchanged
    data leave at least its bytes, a harness that only reports numbers leaves none. Other
    traffic can only add, so compare it as a lower bound. In the notebook it is this machine's
    loopback (other programs add to it too)."""
    traffic = Traffic()
    before = _loopback_bytes()
    yield traffic
    traffic.sent = _loopback_bytes() - before


def _loopback_bytes() -> int:
    if _grading_session is not None:
        return _grading_session.loopback_bytes()
    from .isolation.sandbox import loopback_sent
    with open("/proc/self/net/dev") as f:
        return loopback_sent(f.read())


# In a Jupyter kernel (the lab, `camp check`, nbgrader's Validate) errors start at the student's
# cell and line, with these checks folded (autograder.tracebacks); elsewhere this does nothing.
from .tracebacks import install as _install_tracebacks  # noqa: E402

_install_tracebacks()
