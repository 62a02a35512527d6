"""Where the course's dependencies log: the course log file, never a lab cell's stderr.

A library that logs while nothing configured logging reaches Python's last-resort handler, which
writes WARNING and above to stderr; nbgrader scores a test cell that wrote to stderr 0, and so
does `camp run`. Some libraries log about the machine rather than about the code: bitsandbytes'
CPU backend, when imported (`import peft` imports it), asks the CPU for AVX512-BF16 and, where it
has it, looks for the optional `kernels` package and logs "Failed to load CPU gemm_4bit_forward
... pip install kernels" without it. The fallback it then uses is correct, so the record is a note
for whoever maintains the environment, not for the student: a right answer must not score 0 on a
CPU with more feature flags.

`route()` (run by `import autograder`, so by every lab's setup cell, the grader and `camp`) gives
each logger in `LOGGERS` a handler that appends to `course_log()` and stops its records there
(no propagation, so neither the root logger nor the last-resort handler prints them). Only these
named libraries: everything else, the student's own output included, still reaches stderr. A
library belongs on the list when what it logs depends on the machine or on optional packages,
not on the student's code (tests/autograder/test_dependency_logs.py reproduces such a CPU).

Warnings of the same kind go there too (`MACHINE_WARNINGS`, matched on the message's start):
torch's "Attempting to run cuBLAS, but there was no current CUDA context!" is raised by the
autograd engine's GPU thread on its first matmul (seen on an H200 in a09's backward test); it says
how the CUDA driver was set up, nothing about the student's kernel.
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

LOGGERS = ("bitsandbytes",)
MACHINE_WARNINGS = ("Attempting to run cuBLAS, but there was no current CUDA context",)


def course_log() -> Path:
    """$CAMP_LOG, else ~/.cache/llm-camp/dependencies.log ($XDG_CACHE_HOME honoured)."""
    if os.environ.get("CAMP_LOG"):
        return Path(os.environ["CAMP_LOG"])
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "llm-camp" / "dependencies.log"


class CourseLogHandler(logging.Handler):
    """Appends each record to the course log, opened per record (they are rare). A log that cannot
    be written (a read-only home in the grading sandbox) loses the record silently: reporting the
    failure on stderr is what this handler exists to prevent."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s pid %(process)d %(name)s %(levelname)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            path = course_log()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(self.format(record) + "\n")
        except Exception:
            pass


def _show_machine_warnings_in_log(show):
    """warnings.showwarning that sends `MACHINE_WARNINGS` to the course log and the rest to `show`."""
    def showwarning(message, category, filename, lineno, file=None, line=None):
        if str(message).startswith(MACHINE_WARNINGS):
            record = logging.LogRecord("warnings", logging.WARNING, filename, lineno,
                                       f"{category.__name__}: {message}", None, None)
            CourseLogHandler().emit(record)
            return
        show(message, category, filename, lineno, file, line)
    showwarning.routes_machine_warnings = True
    return showwarning


def route() -> None:
    """Send the records of `LOGGERS`, and the warnings in `MACHINE_WARNINGS`, to the course log
    only. Idempotent."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(h, CourseLogHandler) for h in logger.handlers):
            logger.addHandler(CourseLogHandler())
        logger.propagate = False
    if not getattr(warnings.showwarning, "routes_machine_warnings", False):
        warnings.showwarning = _show_machine_warnings_in_log(warnings.showwarning)
