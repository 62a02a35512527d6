"""The "How to work" block of a released lab, generated from course/labs.toml and the lab's source.

Every lab tells students the same four things in the same words: what to edit (the exercises,
their functions and points), how to check (visible tests, `camp check`), what is forbidden (the
lab's `forbid` list and what using it costs), and the time and prerequisites. Written by hand they
drift apart and go stale when the catalog changes, so `camp build` writes the block into each
released notebook, right after the title cell, and the sources in solutions/ do not carry it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..catalog import Catalog, Lab
from ..grading.entries import is_module
from .labspec import defined_names

CELL_ID = "camp-how-to-work"          # the released cell's id: stable, so builds are reproducible
HEADING = "## How to work"
_EXERCISE = re.compile(r"^#+\s*(Exercise\b.*?)\s*(\([^()]*\bpoints?\s*\))?\s*$", re.M)
# paragraphs of a title cell that the generated block replaces (older labs wrote them by hand)
_OWNED = ("**Time:**", "**Prerequisites:**", "**How to work")


@dataclass(frozen=True)
class Exercise:
    title: str              # "Exercise 1 — a numerically stable softmax", or the cell's grade_id
    names: tuple[str, ...]  # what the student defines there: functions and classes
    points: float


def exercises(source: Path) -> list[Exercise]:
    """The lab's exercises in order: each solution cell, the names it defines, the points of the
    test cells that follow it, titled by the last `## Exercise ...` heading above it."""
    nb = nbformat.read(source, as_version=4)
    found: list[Exercise] = []
    heading, current = None, None
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            titles = _EXERCISE.findall(cell.source)
            if titles:
                heading = titles[-1][0]
            continue
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            if current and current.title == (heading or meta["grade_id"]):   # one exercise, two cells
                current = Exercise(current.title, current.names + tuple(defined_names(cell.source)), current.points)
                found[-1] = current
                continue
            current = Exercise(heading or meta["grade_id"], tuple(defined_names(cell.source)), 0.0)
            found.append(current)
        elif meta.get("grade") and current is not None:
            current = Exercise(current.title, current.names, current.points + float(meta.get("points", 0)))
            found[-1] = current
    return [e for e in found if e.points > 0]


def _points(x: float) -> str:
    return f"{x:g} point" + ("" if x == 1 else "s")


def _forbidden_in_words(entry: str) -> str:
    last = entry.rsplit(".", 1)[-1]
    if "." not in entry or is_module(entry):   # a top-level name is a package, installed here or not
        return f"the module `{entry}` (anything in it)"
    if last[:1].isupper():
        return f"the class `{entry}`"
    return f"`{entry}`"


def _prerequisites(lab: Lab, catalog: Catalog) -> str:
    parts = [f"{r} ({catalog.get(r).title.split(':')[0]})" for r in lab.requires]
    text = (("lab " if len(parts) == 1 else "labs ") + "; ".join(parts)) if parts else "no earlier lab of the course"
    if lab.background:
        text += ". " + lab.background.strip().rstrip(".")
    return text + "."


def how_to_work(lab: Lab, catalog: Catalog, source: Path | None = None) -> str:
    """The markdown of the block for `lab`; `source` (its solution notebook) lists the exercises.
    A planned lab without a notebook gets the same block, without the table of exercises."""
    found = exercises(source) if source is not None and source.exists() else []
    lines = [HEADING, "",
             f"**Time:** about {lab.minutes} minutes. **Prerequisites:** {_prerequisites(lab, catalog)}", "",
             "**What to edit.** Only the cells that contain `# YOUR CODE HERE`: replace that line and "
             "`raise NotImplementedError()` with your code, keeping the given signatures and docstrings."]
    if found:
        total = sum(e.points for e in found)
        lines[-1] += f" One exercise per heading, {_points(total)} in all:"
        lines += ["", "| exercise | you write | points |", "|---|---|---|"]
        lines += [f"| {e.title} | {', '.join(f'`{n}`' for n in e.names) or '—'} | {e.points:g} |" for e in found]
    lines += ["", "Leave the other cells as they are: when grading, the test cells and the read-only cells "
              "are the course's own, whatever your copy says.", "",
              "**How to check.**", "",
              "1. Run the cells from the top. Under each exercise, run its test cell: the visible tests "
              "name the value that is wrong and by how much.",
              "2. When grading, hidden tests check the same properties on other shapes, seeds and dtypes: "
              "make your code general, not fitted to the visible examples.",
              "3. Before submitting, save the notebook and, from a terminal in the course folder, run "
              f"`camp check labs/{lab.name}/{lab.notebook}` (or the path to your copy). It runs everything "
              "grading runs except the hidden tests, and reports every test cell."]
    lines += ["", "**What is forbidden.** "]
    if lab.forbid:
        lines[-1] += ("Your cells must not use " + ", ".join(_forbidden_in_words(f) for f in lab.forbid)
                      + ". Using one in an exercise's cells (imported, called, or reached through a string "
                      "or `getattr`) zeroes that exercise's tests. The test cells may use them: they are "
                      "the trusted references your code is compared with.")
    else:
        lines[-1] += "Nothing in particular: use any library, as long as the tests pass on your own code."
    if lab.notes:
        lines += ["", lab.notes.strip()]
    return "\n".join(lines) + "\n"


def strip_handwritten(title: str) -> str:
    """`title` without the paragraphs the generated block replaces (time, prerequisites, and a
    hand-written "How to work" with its numbered list)."""
    kept, dropping = [], False
    for para in re.split(r"\n\s*\n", title.strip()):
        head = para.lstrip()
        if head.startswith(_OWNED):
            dropping = head.startswith("**How to work")
            continue
        if dropping and re.match(r"\d+\.\s", head):
            continue
        dropping = False
        kept.append(para)
    return "\n\n".join(kept) + "\n"


def insert_block(notebook: Path, lab: Lab, catalog: Catalog, source: Path) -> None:
    """Write the block into the released `notebook` as a markdown cell after the title cell."""
    nb = nbformat.read(notebook, as_version=4)
    nb.cells = [c for c in nb.cells if c.get("id") != CELL_ID]
    if nb.cells and nb.cells[0].cell_type == "markdown":
        nb.cells[0].source = strip_handwritten(nb.cells[0].source).rstrip("\n")
    cell = nbformat.v4.new_markdown_cell(how_to_work(lab, catalog, source).rstrip("\n"))
    cell["id"] = CELL_ID
    nb.cells.insert(1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0, cell)
    nbformat.write(nb, notebook)
