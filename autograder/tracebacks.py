"""What a student sees of an exception: the error first, then where in *their notebook* it
happened ("cell 9, line 4"), with the course's own machinery folded to one line.

One home for three paths that show a student an exception:
- `camp check` and nbgrader's Validate run the notebook in a Jupyter kernel: `install()` (called
  when a lab's setup cell imports `autograder.checks`) makes the kernel show its errors this way;
- `camp grade` runs the student's cells in their sandbox: `student_process` formats the frames of
  an exception from the student's code with `where()`, and the feedback shows them.

Frames of `autograder/` and `camplib/dist/` (the checks, the grader's runner, the rank launcher)
are folded; frames before the first notebook cell (IPython, the kernel, the grader) are dropped;
no `<ipython-input-…>` or `/tmp/ipykernel_…` names. An empty `NotImplementedError()` raised in a
solution cell (the released template) says which exercise is unfinished.
"""
from __future__ import annotations

import os
import re
import traceback
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

MAX_FRAMES = 8        # shown after folding; a deep recursion keeps its first and last ones
MAX_LINE = 160


class Cell(NamedTuple):
    label: str           # "cell 9" (1-based position in the notebook), or "cell In [12]"
    exercise: str = ""   # "exercise 2 — causal and padding masks" when the cell belongs to one
    test: str = ""       # the grade_id of a graded test cell ("test_masks")


def cell_label(index: int) -> str:
    """The one way to name a notebook cell to a student: 1-based, as they count."""
    return f"cell {index + 1}"


def _package_dir(name: str) -> str:
    here = Path(__file__).resolve().parent       # autograder/
    return os.path.join(str(here if name == "autograder" else here.parent / name), "")


FOLDED = (_package_dir("autograder"), _package_dir("camplib/dist"))


def _folded(filename: str) -> bool:
    try:
        return os.path.realpath(filename).startswith(FOLDED) or filename.startswith(FOLDED)
    except (OSError, ValueError):
        return False


def _short_path(filename: str) -> str:
    """site-packages/torch/nn/functional.py -> torch/nn/functional.py; a file beside the notebook
    -> its name; anything else as it is."""
    marker = f"{os.sep}site-packages{os.sep}"
    if marker in filename:
        return filename.split(marker, 1)[1]
    cwd = os.path.join(os.getcwd(), "")
    return filename[len(cwd):] if filename.startswith(cwd) else filename


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_LINE else text[:MAX_LINE - 1] + "…"


def where(frames: Iterable[traceback.FrameSummary], cell_of: Callable[[str], Cell | None]) -> list[str]:
    """The lines that say where, outermost first: each notebook cell frame as "cell 9, line 4"
    (with its code), other files by short path, runs of course frames folded. Starts at the first
    frame in a notebook cell (none found: every frame, folded the same way)."""
    frames = list(frames)
    first = next((i for i, f in enumerate(frames) if cell_of(f.filename)), None)
    if first is not None:
        frames = frames[first:]
    entries: list[str] = []
    folded = 0
    last_cell = max((i for i, f in enumerate(frames) if cell_of(f.filename)), default=-1)
    plumbing: list[str] = []   # library frames between two of the student's (nn.Module.__call__...)
    for i, f in enumerate(frames):
        cell = cell_of(f.filename)
        if cell is None and _folded(f.filename):
            folded += 1
            continue
        if cell is None and i < last_cell:
            short = _short_path(f.filename)
            plumbing.append(short.split("/", 1)[0] or os.path.basename(short))
            continue
        if folded:
            entries.append(f"  … {folded} frame{'s' if folded > 1 else ''} in the course's code (autograder, camplib.dist)")
            folded = 0
        if plumbing:
            entries.append(f"  … {len(plumbing)} frame{'s' if len(plumbing) > 1 else ''} in "
                           + ", ".join(dict.fromkeys(plumbing)))
            plumbing = []
        if cell is not None:
            head = f"  {cell.label}, line {f.lineno}" + (f" (test {cell.test})" if cell.test else "")
            head += "" if f.name == "<module>" else f", in {f.name}"
        else:
            head = f"  {_short_path(f.filename)}, line {f.lineno}, in {f.name}"
        entries.append(head + (f"\n      {_clip(f.line)}" if f.line else ""))
    if folded and entries:   # only course frames: nothing of the student's to point at
        entries.append(f"  … {folded} frame{'s' if folded > 1 else ''} in the course's code (autograder, camplib.dist)")
    if len(entries) > MAX_FRAMES:
        cut = len(entries) - MAX_FRAMES + 1
        entries = entries[:MAX_FRAMES // 2] + [f"  … {cut} more frames …"] + entries[-(MAX_FRAMES // 2 - 1):]
    return entries


def unfinished(exc: BaseException, frames: list[traceback.FrameSummary],
               cell_of: Callable[[str], Cell | None]) -> str:
    """"exercise 2 — causal and padding masks is not written yet" for the released template's
    bare `raise NotImplementedError()` in an exercise's cell; "" for anything else."""
    if type(exc) is not NotImplementedError or str(exc).strip():
        return ""
    cells = [cell_of(f.filename) for f in frames]
    cells = [c for c in cells if c is not None]
    if not cells:
        return ""
    exercise = cells[-1].exercise
    return f"{exercise} is not written yet" if exercise else "this exercise is not written yet"


def error_line(exc: BaseException, frames: list[traceback.FrameSummary] | None = None,
               cell_of: Callable[[str], Cell | None] | None = None) -> str:
    """"TypeError: ..." as Python prints it, or the unfinished exercise it stands for."""
    todo = unfinished(exc, frames or [], cell_of) if cell_of else ""
    if todo:
        return f"NotImplementedError: {todo}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def describe(exc: BaseException, cell_of: Callable[[str], Cell | None]) -> str:
    """The error line, then where (see `where`)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return "\n".join([error_line(exc, frames, cell_of), *where(frames, cell_of)])


# -- notebook cells: exercises and test ids by position --------------------------------------
def notebook_cells(cells: list, label: Callable[[int], str] = cell_label) -> list[Cell]:
    """A `Cell` for every cell of a notebook (nbformat cells or dicts), in order: its label, the
    exercise whose heading (`## Exercise N — title (P points)`) is the last one above it, and its
    grade_id if it is a graded test cell."""
    from .course.howto import _EXERCISE

    out, exercise = [], ""
    for i, cell in enumerate(cells):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        if cell.get("cell_type") == "markdown":   # short heading lines only: the text may be a student's
            titles = [m.group(1) for line in source.splitlines() if line.startswith("#") and len(line) <= 200
                      for m in [_EXERCISE.match(line)] if m]
            if titles:
                exercise = titles[-1].strip()
                exercise = exercise[:1].lower() + exercise[1:]
        meta = cell.get("metadata", {}) if isinstance(cell.get("metadata"), dict) else {}
        nbg = meta.get("nbgrader", {}) if isinstance(meta.get("nbgrader"), dict) else {}
        test = str(nbg.get("grade_id", "")) if nbg.get("grade") and not nbg.get("solution") else ""
        out.append(Cell(label(i), exercise, test))
    return out


# -- in a Jupyter kernel: camp check, Validate, JupyterLab ----------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


class _KernelCells:
    """filename of a kernel cell -> Cell, from the notebook(s) on disk: ipykernel names a cell's
    code by a hash of its source, so the cell with the same source is the one that ran. `notebook`
    when known (camp check), else every notebook in the kernel's folder (Validate runs there).
    A cell not found (an unsaved edit) is named by its execution count, as Jupyter shows it."""

    def __init__(self, shell, notebook: str | None = None):
        self.shell, self.notebook = shell, notebook
        self._map: dict[str, Cell] = {}
        self._stamp = None

    def _refresh(self) -> None:
        import json

        paths = [Path(self.notebook)] if self.notebook else sorted(Path.cwd().glob("*.ipynb"))[:5]
        stamp = tuple((str(p), p.stat().st_mtime_ns) for p in paths if p.is_file())
        if stamp == self._stamp:
            return
        self._stamp, self._map = stamp, {}
        name_of = self.shell.compile.get_code_name
        for path, _ in reversed(stamp):   # the first notebook wins a tie
            try:
                nb = json.loads(Path(path).read_text(encoding="utf-8-sig"))
                cells = nb["cells"]
                for cell, info in zip(cells, notebook_cells(cells)):
                    if cell.get("cell_type") == "code":
                        source = cell.get("source", "")
                        source = "".join(source) if isinstance(source, list) else str(source)
                        self._map[name_of(source, source, 0)] = info
            except Exception:   # noqa: BLE001 - not a notebook we can read: fall back to In [N]
                continue

    def __call__(self, filename: str) -> Cell | None:
        try:
            self._refresh()
        except Exception:  # noqa: BLE001
            pass
        if filename in self._map:
            return self._map[filename]
        number = getattr(self.shell.compile, "_filename_map", {}).get(filename)
        return Cell(f"cell In [{number}]") if number is not None else None


def install(shell=None, notebook: str | None = None) -> bool:
    """Make this IPython kernel show errors as `describe` does (False outside IPython). Anything
    going wrong in here falls back to IPython's own traceback, never hides the error."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
        if getattr(shell, "kernel", None) is None:   # a kernel only, not the grader's runner
            return False
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    notebook = notebook or getattr(shell, "_camp_notebook", None)
    shell._camp_notebook = notebook
    cells = _KernelCells(shell, notebook)

    def handler(self, etype, value, tb, tb_offset=None):
        import sys
        sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb   # %debug still works
        if hasattr(sys, "last_exc"):
            sys.last_exc = value
        try:
            stb = describe(value, cells).splitlines()
        except Exception:   # noqa: BLE001 - our formatting must never cost the student the error
            stb = self.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
        self._showtraceback(etype, value, stb)
        return None

    shell.set_custom_exc((Exception,), handler)
    return True
