"""Stand-ins, inside the trusted grading process, for what a student defined in their notebook.

`RemoteObject` looks like the student's function, class or module instance: calling it sends
the arguments to the student's process and returns the answer as plain tensors and data. The
course's test code runs unchanged against these stand-ins, with the real torch and the real
checks, so nothing the student's code does to its own interpreter can change a comparison.
"""
from __future__ import annotations

import time

from ..isolation.sandbox import Sandbox, StudentCrashed
from .wire import Handle, decode, encode


class StudentError(AssertionError):
    """The student's code raised; the message carries their exception."""


# Exceptions a test may expect from the student's code (`with pytest.raises(ValueError)`, say):
# the stand-in raises a StudentError that is also an instance of the same built-in type.
_EXPECTABLE = (ValueError, TypeError, IndexError, KeyError, RuntimeError, NotImplementedError,
               AttributeError, ZeroDivisionError, ArithmeticError, LookupError)
_AS_STUDENT = {cls.__name__: type(f"Student{cls.__name__}", (StudentError, cls), {}) for cls in _EXPECTABLE}


class Session:
    """A connection to the student's process (its forbidden calls reach the grader on their own
    channel: `Sandbox.read_reports`)."""

    def __init__(self, sandbox: Sandbox, deadline: float | None = None, ranks=None):
        self.sandbox, self.deadline = sandbox, deadline
        self.ranks = ranks   # the grader's rank sandboxes (rank_pool.RankPool), where a test needs them

    def request(self, op: str, label: str, **fields):
        payload = {}
        tensors = {}
        for key, value in fields.items():
            structure, ts = encode(value)
            renamed = {f"{key}.{k}": v for k, v in ts.items()}
            payload[key] = _rename(structure, key)
            tensors.update(renamed)
        timeout = self.sandbox.limits.cell_seconds
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
            if timeout <= 0:
                raise StudentError(f"{label}: the notebook's total time limit was reached")
        try:
            header, out = self.sandbox.request({"op": op, **payload}, tensors, timeout=timeout)
        except StudentCrashed as exc:
            raise StudentError(f"{label}: {exc}") from None
        if not header.get("ok"):
            error = _AS_STUDENT.get(str(header.get("error_type") or ""), StudentError)
            where = _last_student_frames(header.get("traceback"))
            raise error(f"{label} raised {str(header.get('error', 'an error'))[:1000]}" + (f"\n{where}" if where else ""))
        return decode(header.get("value"), out, lambda h: RemoteObject(self, h, label.removesuffix("(...)")))

    def loopback_bytes(self) -> int:
        """The kernel's count of bytes sent on the sandbox's loopback interface (read here)."""
        try:
            return self.sandbox.loopback_bytes()
        except (OSError, StudentCrashed) as exc:
            raise StudentError(f"the bytes your ranks sent could not be counted: {exc}") from None

    def separate_ranks(self, path: str, fn, per_rank: list, timeout: float):
        if self.ranks is None:
            raise RuntimeError("this grading session starts no separate ranks")
        return self.ranks.run(path, fn, per_rank, timeout)

    def make(self, path: str, args, kwargs):
        return self.request("make", f"{path}(...)", path=path, args=list(args), kwargs=dict(kwargs))


def _last_student_frames(tb, lines: int = 12) -> str:
    """Where in their notebook the student's code raised, as their process formatted it
    (autograder.tracebacks: "cell 8, line 3, in softmax", the course's frames folded), bounded:
    the innermost `lines` lines. Their own text, shown only to them."""
    if not isinstance(tb, str) or not tb.strip():
        return ""
    return "\n".join(tb.rstrip().splitlines()[-lines:])[-1200:]


def _rename(structure, prefix: str):
    """Prefix tensor keys so several encoded fields can share one safetensors blob."""
    if isinstance(structure, list):
        return [_rename(x, prefix) for x in structure]
    if isinstance(structure, dict):
        if set(structure) == {"__tensor__"}:
            return {"__tensor__": f"{prefix}.{structure['__tensor__']}"}
        return {k: _rename(v, prefix) for k, v in structure.items()}
    return structure


class RemoteObject:
    """A function, class or object living in the student's process."""

    def __init__(self, session: Session, target: str | int, label: str):
        self._session, self._target, self._label = session, target, label

    def __repr__(self) -> str:
        return f"<student's {self._label}>"

    def __getattr__(self, name: str):
        if name.startswith("_"):  # Python's own protocols (__len__, _repr_html_...) stay local
            raise AttributeError(name)
        return self._session.request("getattr", f"{self._label}.{name}", target=self._target_ref(), name=name)

    def __call__(self, *args, **kwargs):
        return self._session.request("call", f"{self._label}(...)", target=self._target_ref(),
                                     args=list(args), kwargs=dict(kwargs))

    def _as_handle(self) -> int | str:
        """An object id, or a name the student's notebook defines (resolved there)."""
        return self._target

    def _target_ref(self):
        return self._target if isinstance(self._target, str) else Handle(self._target)

    def _forward_backward(self, args, kwargs, grad_output):
        return self._session.request("forward_backward", f"{self._label} forward/backward",
                                     target=self._target_ref(), args=list(args), kwargs=dict(kwargs),
                                     grad_output=grad_output)

    def _load_parameters(self, params):
        return self._session.request("load_parameters", f"loading parameters into {self._label}",
                                     target=self._target_ref(), params=dict(params))

    def _parameters(self):
        return self._session.request("parameters", f"parameters of {self._label}", target=self._target_ref())


def is_remote(obj) -> bool:
    return isinstance(obj, RemoteObject)
