"""`camp run`: execute solution notebooks with papermill under a parameter profile.

`ci` runs small on CPU (each lab under CI_BUDGET_S on 2 cores); `gpu` runs the sizes the course
is meant for. A run also fails when a graded test cell writes to stderr, because nbgrader
would score that cell 0 even though it passed.
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..catalog import Lab
from .kernel_client import SlicedWaitKernelManager
from .nbgrader_setup import put_environment_on_path

CI_BUDGET_S = 45.0
# A cell's limit outside the ci profile, unless `camp run --cell-timeout` says otherwise: the gpu
# profile's training cells take minutes by design (the labs' own cell_timeout guards grading).
LARGE_PROFILE_CELL_TIMEOUT_S = 3600


@dataclass
class RunResult:
    lab: str
    profile: str
    seconds: float
    ok: bool
    message: str = ""
    output: Path | None = None

    def slowest_cells(self, n: int = 3) -> str:
        """'4.1 s `import transformers`, ...': where the time went, from papermill's per-cell timings."""
        try:
            cells = nbformat.read(self.output, as_version=4).cells
        except Exception:
            return "no executed notebook"
        timed = sorted(((c.metadata.get("papermill", {}).get("duration") or 0.0,
                         next((line for line in c.source.splitlines() if line.strip()), ""))
                        for c in cells if c.cell_type == "code"), reverse=True)
        cells_s = sum(t for t, _ in timed)
        return (f"cells {cells_s:.1f} s of {self.seconds:.1f} s (the rest: kernel start-up and papermill); slowest: "
                + ", ".join(f"{t:.1f} s `{line[:50]}`" for t, line in timed[:n]))


def parse_value(text: str):
    """A `-p NAME VALUE` value: JSON when it parses (numbers, true/false, lists), else a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def run_lab(lab: Lab, root: Path, out_dir: Path, profile: str = "ci", overrides: dict | None = None,
            cell_timeout: int | None = None) -> RunResult:
    """Execute lab's solution notebook in out_dir/<lab.name>/ (a copy of its folder) and report.
    Each cell may take `cell_timeout` seconds: by default the lab's own limit in the ci profile,
    LARGE_PROFILE_CELL_TIMEOUT_S in the others."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    put_environment_on_path()
    params = {**lab.parameters(profile), **(overrides or {})}
    work = out_dir / lab.name
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(lab.source_path(root).parent, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    output = work / lab.notebook
    timeout = cell_timeout or (lab.cell_timeout if profile == "ci" else LARGE_PROFILE_CELL_TIMEOUT_S)
    start = time.perf_counter()
    try:
        papermill.execute_notebook(str(lab.source_path(root)), str(output), parameters=params,
                                   kernel_name="python3", cwd=str(work), progress_bar=False,
                                   log_output=False, execution_timeout=timeout,
                                   kernel_manager_class=SlicedWaitKernelManager)
    except PapermillExecutionError as exc:
        where = describe_cell(output, exc.exec_count, exc.source)
        return RunResult(lab.id, profile, time.perf_counter() - start, False,
                         f"{where}: {exc.ename}: {exc.evalue}".strip(), output)
    except Exception as exc:  # kernel died, timeout, bad notebook: report, never crash the table
        return RunResult(lab.id, profile, time.perf_counter() - start, False,
                         f"{type(exc).__name__}: {exc}".splitlines()[0], output)
    seconds = time.perf_counter() - start
    noisy = stderr_test_cells(output)
    if noisy:
        return RunResult(lab.id, profile, seconds, False,
                         f"graded test cell(s) wrote to stderr (nbgrader scores them 0): {', '.join(noisy)}", output)
    result = RunResult(lab.id, profile, seconds, True, "", output)
    if profile == "ci" and seconds > CI_BUDGET_S:
        result.message = f"over the {CI_BUDGET_S:.0f} s CI budget: {result.slowest_cells()}"
    return result


def describe_cell(notebook: Path, exec_count: int | None, source: str) -> str:
    """'cell In [12] (grade_id test_sdpa)' or 'cell In [12] (`first line`)' for a failing cell."""
    grade_id = None
    try:
        for cell in nbformat.read(notebook, as_version=4).cells:
            if cell.cell_type == "code" and cell.source == source:
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
                break
    except Exception:
        pass
    first = next((line for line in (source or "").splitlines() if line.strip()), "")
    return f"cell In [{exec_count}] " + (f"(grade_id {grade_id})" if grade_id else f"(`{first[:60]}`)")


def stderr_test_cells(notebook: Path) -> list[str]:
    """grade_ids of graded test cells whose outputs include a stderr stream."""
    nb = nbformat.read(notebook, as_version=4)
    noisy = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            if any(o.get("output_type") == "stream" and o.get("name") == "stderr" for o in cell.get("outputs", [])):
                noisy.append(meta.get("grade_id", "?"))
    return noisy
