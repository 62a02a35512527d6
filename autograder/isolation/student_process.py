"""The process that holds a student's code during grading (inside the sandbox).

It runs the student's cells when asked, then answers requests from the grader: call a function
the student defined, construct one of their classes, run forward and backward, load or read
module parameters. Only tensors and plain data go back (autograder.grading.wire). The grader never
trusts anything this process computes except as "the student's answer".

Protocol on the original stdin/stdout (the student's own prints go to the original stderr: a
log file the grader opened outside anything the student can write):
  request  {"op": "exec"|"call"|"getattr"|"make"|"forward_backward"|"load_parameters"|"parameters"|"canary", ...}
  response {"ok": true, "value": ...} | {"ok": false, "error": "...", ...}

Before anything of the student's runs, the process arms the forbidden-API observer for its whole
life (autograder.grading.observe: every thread, every forked child), which reports on the
descriptor `report_fd` the grader handed down, and (`no_exec`: "required" in the sandbox, "try"
outside it) refuses to start any new program (autograder.isolation.seccomp). `canary` calls the forbidden APIs the grader names, so the grader
can tell a working observer from a tampered one by what reaches it. Tracebacks sent back keep
only the student's own frames.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

MAX_TRACEBACK = 4000


class Runner:
    def __init__(self, forbid: list[str], report_fd: int | None = None, collectives: bool = False):
        from ..grading.observe import arm

        self.observer = arm(forbid, report_fd, collectives)
        self.handles: dict[int, object] = {}
        from IPython.core.interactiveshell import InteractiveShell

        self.shell = InteractiveShell.instance(colors="nocolor")
        self.shell.automagic = False   # `run x.py` is a syntax error, as the grader's scan reads it
        self.ns = self.shell.user_ns
        self.cells: dict = {}          # IPython's name for a cell's code -> tracebacks.Cell (its label)

    # -- values -------------------------------------------------------------------------
    def register(self, obj) -> int:
        self.handles[id(obj)] = obj
        return id(obj)

    def resolve(self, handle_id: int | str):
        if isinstance(handle_id, str):  # something the notebook defines, passed by name
            if handle_id not in self.ns:
                raise NameError(f"name '{handle_id}' is not defined in your notebook")
            return self.ns[handle_id]
        if handle_id not in self.handles:
            raise KeyError(f"unknown object handle {handle_id}")
        return self.handles[handle_id]

    def target(self, req):
        from ..grading.wire import decode
        t = req["target"]
        if isinstance(t, str):
            if t not in self.ns:
                raise NameError(f"name '{t}' is not defined in your notebook")
            return self.ns[t]
        return decode(t, {}, self.resolve)

    # -- operations ---------------------------------------------------------------------
    def op_exec(self, req, tensors):
        from ..tracebacks import Cell, describe
        names = set(getattr(self.shell.compile, "_filename_map", {}))
        result = self.shell.run_cell(req["source"], store_history=False, silent=False)
        cell = Cell(str(req.get("cell") or "a cell"), str(req.get("exercise") or ""))
        for name in set(getattr(self.shell.compile, "_filename_map", {})) - names:
            self.cells[name] = cell
        err = result.error_before_exec or result.error_in_exec
        sys.stdout.flush()
        sys.stderr.flush()
        if err is None:
            return {"ok": True, "value": None}
        text = describe(err, self.cells.get) if err.__traceback__ is not None else f"{type(err).__name__}: {err}"
        return {"ok": True, "value": text[:MAX_TRACEBACK]}

    def op_getattr(self, req, tensors):
        name = req["name"]
        if not isinstance(name, str) or name.startswith("_"):
            raise AttributeError(f"attribute {name!r} cannot be read by the grader")
        return self.reply(getattr(self.target(req), name))

    def op_call(self, req, tensors):
        from ..grading.wire import decode
        fn = self.target(req)
        args, kwargs = decode(req["args"], tensors, self.resolve), decode(req["kwargs"], tensors, self.resolve)
        return self.reply(fn(*args, **kwargs))

    def op_make(self, req, tensors):
        import importlib

        from ..checks import make_allowed
        from ..grading.wire import decode
        path = req["path"]
        if not make_allowed(path):
            raise ValueError(f"make: {path!r} is not allowed")
        module, _, name = path.rpartition(".")
        factory = getattr(importlib.import_module(module), name)
        args, kwargs = decode(req["args"], tensors, self.resolve), decode(req["kwargs"], tensors, self.resolve)
        return self.reply(factory(*args, **kwargs))

    def op_forward_backward(self, req, tensors):
        from ..checks import forward_backward
        from ..grading.wire import decode
        fn = self.target(req)
        args, kwargs = decode(req["args"], tensors, self.resolve), decode(req["kwargs"], tensors, self.resolve)
        grad_output = decode(req["grad_output"], tensors, self.resolve)
        return self.reply(forward_backward(fn, *args, grad_output=grad_output, **kwargs), handles=False)

    def op_load_parameters(self, req, tensors):
        from ..checks import load_parameters
        from ..grading.wire import decode
        load_parameters(self.target(req), decode(req["params"], tensors))
        return self.reply(None)

    def op_parameters(self, req, tensors):
        from ..checks import parameters_of
        return self.reply(parameters_of(self.target(req)), handles=False)

    def op_canary(self, req, tensors):
        plan = [tuple(item) for item in req.get("plan", []) if isinstance(item, list) and len(item) == 3]
        self.observer.canary(plan, int(req.get("seed", 0)))
        return {"ok": True, "value": None}

    def reply(self, value, handles: bool = True):
        from ..grading.wire import encode
        structure, out = encode(value, self.register if handles else None)
        return {"ok": True, "value": structure}, out

    def handle(self, req, tensors):
        op = getattr(self, "op_" + str(req.get("op")), None)
        if op is None:
            return {"ok": False, "error": f"unknown operation {req.get('op')!r}"}
        try:
            response = op(req, tensors)
        except BaseException as exc:  # the student's exception (even SystemExit) is their answer
            response = {"ok": False, "error": student_error(exc, self.cells)[:1000],
                        "traceback": student_traceback(exc, self.cells),
                        "error_type": type(exc).__name__ if type(exc).__module__ == "builtins" else ""}
        return response if isinstance(response, tuple) else (response, {})


def student_error(exc: BaseException, cells: dict | None = None) -> str:
    """'Type: message', or the unfinished exercise a bare NotImplementedError stands for."""
    from ..tracebacks import error_line
    cells = cells or {}
    return error_line(exc, traceback.extract_tb(exc.__traceback__), cells.get)


def student_traceback(exc: BaseException, cells: dict | None = None) -> str:
    """Where in the student's notebook `exc` happened, from their first cell on ("cell 8, line 3,
    in softmax"), the course's frames folded and the grader's own dropped (autograder.tracebacks)."""
    from ..tracebacks import where
    cells = cells or {}
    return "\n".join(where(traceback.extract_tb(exc.__traceback__), cells.get))[-MAX_TRACEBACK:]


def main() -> None:
    from ..grading.wire import read_message, write_message

    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)   # prints join stderr in the grader's log (no file in the student's folder)
    sys.stdin = open(os.devnull)
    sys.path.append(os.getcwd())  # the submission's own helper modules import, but never shadow a library
    if config.get("no_exec"):
        from .seccomp import forbid_exec
        try:
            forbid_exec()
        except OSError:
            if config["no_exec"] == "required":
                raise   # the process ends here, before the student's code: a grader error, retried

    runner = Runner(config.get("forbid", []), config.get("report_fd"), bool(config.get("collectives")))
    write_message(proto_out, {"ok": True, "ready": True})
    while True:
        try:
            req, tensors = read_message(proto_in)
        except EOFError:
            return
        header, out = runner.handle(req, tensors)
        try:
            write_message(proto_out, header, out)
        except Exception as exc:  # e.g. a returned tensor safetensors cannot store
            write_message(proto_out, {"ok": False, "error": f"could not send the result: {exc}"[:1000]})


if __name__ == "__main__":
    main()
