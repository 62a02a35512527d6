"""Turn a student's notebook into the list of cells to run in their sandbox, repairing its
structure against the lab's source and saying what was repaired.

Rules: graded test cells never run in the student's process (the grader runs the course's own
copy outside it), wherever they are and whatever the student did to them; locked cells run as
the course wrote them; a solution cell runs once (the first copy of a duplicated one); cells
the student added run as written; cells tagged `skip-grading` (demos) are skipped. A deleted,
duplicated, re-typed or metadata-stripped graded cell is noted for the feedback.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..course.labspec import LabSpec
from ..tracebacks import cell_label


class ProgramCell(NamedTuple):
    label: str              # how feedback names it: "cell 7 (sdpa)", 1-based (tracebacks.cell_label)
    source: str
    grade_id: str | None    # the nbgrader cell it came from, if any


@dataclass
class Program:
    cells: list[ProgramCell] = field(default_factory=list)   # in the order they run
    notes: list[str] = field(default_factory=list)


def build_program(spec: LabSpec, nb) -> Program:
    program = Program()
    test_ids = {t.grade_id for t in spec.tests}
    visible_tests = {t.visible_source.strip() for t in spec.tests}
    seen: dict[str, int] = {}
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {}) if isinstance(cell.metadata, dict) else {}
        grade_id = meta.get("grade_id")
        known = grade_id in test_ids or grade_id in spec.locked or grade_id in spec.solution_ids
        if known:
            seen[grade_id] = seen.get(grade_id, 0) + 1
        if cell.cell_type != "code":
            if known:
                program.notes.append(f"cell '{grade_id}' was turned into {cell.cell_type}: "
                                     + ("the course's version was used" if grade_id in spec.locked else "it was not run"))
                if grade_id in spec.locked and grade_id not in test_ids and seen[grade_id] == 1:
                    program.cells.append(ProgramCell(grade_id, spec.locked[grade_id], grade_id))
            continue
        if "skip-grading" in cell.metadata.get("tags", []):
            continue
        label = cell_label(index) + (f" ({grade_id})" if grade_id else "")
        if grade_id in test_ids or (not known and cell.source.strip() in visible_tests):
            if not known:
                program.notes.append(f"{label} looks like a test cell without its grading metadata: "
                                     "the course's tests were run instead")
            continue
        if known and seen[grade_id] > 1:
            program.notes.append(f"cell '{grade_id}' appears {seen[grade_id]} times: only the first copy was run")
            continue
        if grade_id in spec.locked:
            if cell.source != spec.locked[grade_id]:
                program.notes.append(f"read-only cell '{grade_id}' was edited: the course's version was run")
            program.cells.append(ProgramCell(label, spec.locked[grade_id], grade_id))
            continue
        program.cells.append(ProgramCell(label, cell.source, grade_id))
    for grade_id in spec.solution_ids:
        if grade_id not in seen:
            program.notes.append(f"solution cell '{grade_id}' is missing (deleted, or its metadata was "
                                 "stripped): code outside graded cells was still run")
    missing_locked = [g for g in spec.locked if g not in test_ids and g not in seen]
    for grade_id in missing_locked:
        program.notes.append(f"read-only cell '{grade_id}' was deleted: the course's version was run first")
    program.cells[:0] = [ProgramCell(g, spec.locked[g], g) for g in missing_locked]
    for grade_id in sorted(test_ids - set(seen)):
        program.notes.append(f"test cell '{grade_id}' was deleted or altered: the course's copy was run")
    return program
