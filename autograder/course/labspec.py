"""What the grader needs to know about a lab, read from its *source* notebook (trusted).

- the parameters cell and the cells tagged `setup`: run in the trusted process before the tests
  (imports, device, the checks helper);
- the names the solution cells define (softmax, MultiHeadAttention...): during grading these
  are stand-ins for the student's objects;
- the graded test cells, whole (hidden tests included), and their visible part as released;
- every locked cell, to restore it if a submission altered it.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*\n?", re.S | re.M)


@dataclass(frozen=True)
class TestCell:
    grade_id: str
    points: float
    source: str           # with hidden tests: what the grader runs
    visible_source: str   # as released: what feedback shows


@dataclass
class LabSpec:
    name: str
    notebook: str
    parameters: str
    setup: list[str]
    student_names: list[str]
    tests: list[TestCell]
    solution_ids: list[str]
    locked: dict[str, str] = field(default_factory=dict)   # grade_id -> source of locked cells
    solution_tests: dict[str, list[str]] = field(default_factory=dict)  # solution id -> its tests
    folder: str = ""      # the lab's source folder: files identical to its own are the course's, not scanned

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tests)

    @classmethod
    def from_notebook(cls, path: Path) -> "LabSpec":
        nb = nbformat.read(path, as_version=4)
        parameters, setup, names, tests, solutions, locked = "", [], [], [], [], {}
        following: dict[str, list[str]] = {}
        last_solution = None
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            meta = cell.metadata.get("nbgrader", {})
            tags = cell.metadata.get("tags", [])
            if "parameters" in tags:
                parameters = cell.source
            elif "setup" in tags:
                setup.append(cell.source)
            if meta.get("solution"):
                solutions.append(meta["grade_id"])
                names += [n for n in defined_names(cell.source) if n not in names]
                last_solution = meta["grade_id"]
                following[last_solution] = []
            elif meta.get("grade"):
                tests.append(TestCell(meta["grade_id"], float(meta.get("points", 0)), cell.source,
                                      HIDDEN.sub("", cell.source)))
                if last_solution:
                    following[last_solution].append(meta["grade_id"])
            if meta.get("locked") and meta.get("grade_id"):
                locked[meta["grade_id"]] = cell.source
        return cls(path.parent.name, path.name, parameters, setup, names, tests, solutions, locked, following,
                   str(path.parent))


def defined_names(source: str) -> list[str]:
    """Top-level functions, classes and assigned names of a cell."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names
