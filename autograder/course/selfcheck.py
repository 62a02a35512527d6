"""`camp check NOTEBOOK`: a student's self-check before submitting.

Runs everything `camp grade` runs except the hidden tests: validates the notebook, compares
its graded cells with the released lab and reports the same structure repairs the grader will
make, applies the grader's own static forbidden-API scan to every cell and every .py file next
to the notebook (a test it would zero is reported as failing here too), executes a copy (the
student's file is never modified) and reports each visible test cell. What it cannot check
(hidden tests, the runtime observer of forbidden calls) it says so.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..catalog import Catalog
from .nbgrader_setup import put_environment_on_path


@dataclass
class TestResult:
    grade_id: str
    points: float
    passed: bool
    message: str = ""


def structure_problems(nb, released) -> list[str]:
    """Differences in graded cells between a student's notebook and the released lab."""
    def ids(notebook):
        return [c.metadata["nbgrader"]["grade_id"] for c in notebook.cells
                if c.metadata.get("nbgrader", {}).get("grade_id")]
    mine, expected = Counter(ids(nb)), Counter(ids(released))
    problems = [f"graded cell '{g}' is missing" for g in expected if g not in mine]
    problems += [f"graded cell '{g}' appears {n} times" for g, n in mine.items() if n > 1]
    problems += [f"cell '{g}' is not part of this lab" for g in mine if g not in expected]
    return problems


PREAMBLE_ID = "camp-check-tracebacks"


def run_visible_tests(path: Path, timeout: int = 120, nb=None) -> list[TestResult]:
    """Execute a copy of the notebook (cwd = its folder) and report every graded test cell.
    `nb`: the notebook as already read (check_notebook), else read from `path`.
    Errors are shown as autograder.tracebacks formats them (cell and line in the student's
    notebook); the kernel's own log (its TCP warning, a KeyboardInterrupt when it is stopped)
    goes to a file, shown only if the kernel died."""
    import copy
    import tempfile

    from nbclient import NotebookClient

    from .kernel_client import SlicedWaitKernelManager

    put_environment_on_path()
    nb = copy.deepcopy(nb) if nb is not None else nbformat.read(path, as_version=4)
    preamble = nbformat.v4.new_code_cell(
        f"from autograder.tracebacks import install\ninstall(notebook={str(path.resolve())!r})", id=PREAMBLE_ID)
    nb.cells.insert(0, preamble)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            kernel_manager_class=SlicedWaitKernelManager,
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    with tempfile.TemporaryFile("w+") as log:
        try:
            client.execute(stderr=log, stdout=log)
        except Exception as exc:   # the kernel died or a cell timed out: report what ran
            log.seek(0)
            return _results(nb, stopped_reason(nb, exc, log.read()))
    return _results(nb)


def stopped_reason(nb, exc: Exception, log: str) -> str:
    """'not run: the kernel died while running cell 12 (DeadKernelError)', with the last lines the
    kernel wrote (its TCP-encryption warning left out: that is not the student's business)."""
    from ..tracebacks import cell_label

    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    done = [i for i in code if nb.cells[i].get("execution_count") is not None]
    # the cell that stopped it: the first code cell after the last one that finished
    stopped = next((i for i in code if not done or i > done[-1]), None)
    where = f" while running {cell_label(stopped - 1)}" if stopped else ""   # -1: the preamble cell
    what = "timed out" if "Timeout" in type(exc).__name__ else "died"
    lines = [line for line in log.splitlines() if line.strip() and "without encryption" not in line][-3:]
    return f"not run: the notebook's kernel {what}{where} ({type(exc).__name__})" + \
        ("".join(f"\n  {line[:200]}" for line in lines))


def _results(nb, stopped: str = "") -> list[TestResult]:
    results = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        ran = cell.get("execution_count") is not None
        message = error_text(errors[0]) if errors else ("" if ran or not stopped else stopped)
        results.append(TestResult(meta.get("grade_id", "?"), float(meta.get("points", 0)), ran and not errors, message))
    return results


def error_text(output) -> str:
    """An error output as the student should read it: the kernel's traceback when it is the
    short one autograder.tracebacks wrote (no colour codes), else 'Type: message'."""
    from ..tracebacks import strip_ansi

    lines = [strip_ansi(str(x)) for x in output.get("traceback", []) if isinstance(x, str)]
    text = "\n".join(lines).strip()
    if text and "Traceback (most recent call last)" not in text and "-----" not in text:
        return text
    return f"{output.get('ename')}: {output.get('evalue')}"


NOT_CHECKED = ("not checked here: hidden tests and the runtime observer of forbidden calls run only when "
               "your notebook is graded (the static forbidden-API scan above is the grader's own)")


def grading_problems(nb, lab, root: Path, folder: Path) -> tuple[list[str], dict[str, str]]:
    """(the grader's structure repair notes, test -> why grading would score it 0) for `nb`,
    from the released lab: the same build_program and static scan `camp grade` runs."""
    from ..grading.program import build_program
    from ..grading.static_check import banned_tests
    from .labspec import LabSpec

    released = lab.release_path(root)
    spec = LabSpec.from_notebook(released)
    program = build_program(spec, nb)
    banned = banned_tests(spec, program.cells, list(lab.forbid), folder, released.parent)
    return program.notes, banned


def read_submission(path: Path, catalog: Catalog):
    """(notebook, None) or (None, why it is not a valid notebook): the upload check's own rule
    and caps (autograder.grading.uploads), so what `camp check` accepts the grader accepts."""
    from ..grading.uploads import SubmissionError, check_notebook as upload_check
    from ..grading.uploads.files import read_bounded

    try:
        return upload_check(read_bounded(path, catalog.caps.notebook_bytes), catalog.caps, path.name), None
    except SubmissionError as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"cannot read {path.name}: {exc.strerror or exc}"


def check_notebook(path: Path, catalog: Catalog, root: Path) -> tuple[list[str], list[TestResult]]:
    """(structure problems and grading notes, visible test results) for a student's notebook."""
    nb, problem = read_submission(path, catalog)
    if problem:
        return [problem], []
    problems: list[str] = []
    banned: dict[str, str] = {}
    timeout = 120
    try:
        lab = catalog.get(path.stem)
        timeout = lab.cell_timeout
        released = lab.release_path(root)
        if released.exists():
            problems = structure_problems(nb, nbformat.read(released, as_version=4))
            notes, banned = grading_problems(nb, lab, root, path.parent)
            problems += [f"grading will repair: {n}" for n in notes if f"grading will repair: {n}" not in problems]
            problems += [f"{test} will score 0 when graded: {why}" for test, why in banned.items()]
        else:
            problems.append(f"the released lab {released} is missing: structure and forbidden APIs not checked")
    except KeyError:
        problems = [f"'{path.name}' is not a lab notebook of this course; checking its tests anyway "
                    "(structure and forbidden APIs not checked)"]
    results = run_visible_tests(path, timeout, nb)
    for r in results:
        if r.grade_id in banned:
            r.passed, r.message = False, banned[r.grade_id]
    return problems, results
