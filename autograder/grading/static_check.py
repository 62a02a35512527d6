"""The trusted static check of a whole submission, shared by `camp grade` and `camp check`:
every cell that will run and every file the submission could import, scanned for forbidden APIs
and for what would escape the scan (autograder.grading.forbid), turned into "test -> why it
scores 0".

Which tests a problem costs: a forbidden API in a solution cell costs that exercise's tests and
the tests of every exercise whose cells use a name that cell defines (the attention module
calling a forbidden attention function); anywhere else (a cell the student added, a .py file)
it can affect anything, so it costs every test. Code the scan cannot check (unparsable source,
magics that run hidden code, a compiled module) and tampering cost every test.
"""
from __future__ import annotations

import ast
from pathlib import Path

from ..course.labspec import LabSpec
from .entries import is_module, resolve
from .forbid import _ipython_transform, check, own_attributes, scan, unparsable_cell

# Files Python can import or load that the scan cannot read.
UNSCANNABLE = {".pyc", ".pyo", ".so", ".pyd", ".dll", ".dylib", ".pth", ".egg", ".whl"}
MAX_FILES = 500


def course_sources(spec: LabSpec) -> set[str]:
    return set(spec.locked.values()) | {spec.parameters, *spec.setup}


def submission_files(folder: Path, course_folder: Path | None) -> tuple[list[Path], list[Path]]:
    """(.py files, unscannable importable files) under `folder`, any depth, leaving out files
    identical to the course's own copy of the same path."""
    py, opaque = [], []
    for path in sorted(folder.rglob("*"))[: MAX_FILES * 4]:
        if not path.is_file() or path.is_symlink():
            continue
        rel = path.relative_to(folder)
        ours = course_folder / rel if course_folder else None
        if ours is not None and ours.is_file() and ours.read_bytes() == path.read_bytes():
            continue
        if path.suffix == ".py":
            py.append(path)
        elif path.suffix in UNSCANNABLE or ".so." in path.name or path.name.endswith(".cpython"):
            opaque.append(path)
    return py[:MAX_FILES], opaque


def banned_tests(spec: LabSpec, cells, forbid: list[str], folder: Path | None = None,
                 course_folder: Path | None = None) -> dict[str, str]:
    """test grade_id -> message, for every test a forbidden API or an escape from the scan costs.
    `cells`: (label, source, grade_id) in the order they run."""
    all_tests = [t.grade_id for t in spec.tests]
    banned: dict[str, str] = {}
    if not forbid:
        return banned

    def ban(tests, message):
        for test in tests:
            banned.setdefault(test, message)

    py_files, opaque = submission_files(folder, course_folder) if folder else ([], [])
    for path in opaque:
        ban(all_tests, f"{path.relative_to(folder)} could be imported but the grader cannot read it "
                       "(compiled or packed code): submit Python source")
    sources = [(f"{p.relative_to(folder)}", p.read_text(errors="replace"), None, False) for p in py_files]
    local = {p.relative_to(folder).parts[0].removesuffix(".py") for p in py_files}
    local = {m for m in local if not is_module(m)}    # a file named like a library never shadows it
    course = course_sources(spec)
    student_cells = [(label, source, gid, True) for label, source, gid in cells
                     if source not in course and not unparsable_cell(source)]   # never run (engine)
    own = own_attributes([s for _, s, _, _ in student_cells + sources])
    aliases: dict[str, str] = {}
    for source in [spec.parameters, *spec.setup]:      # imports the course's own cells make
        scan(source, [], aliases=aliases)
    defines = _defines(cells)
    scans = []
    for label, source, grade_id, is_cell in student_cells + sources:
        result = check(source, forbid, cell=is_cell, own=own, local_modules=local,
                       aliases=aliases if is_cell else {})
        scans.append((label, grade_id, is_cell, result))
    escaped = {}      # carriers handed where the scan cannot follow, anywhere in the submission
    for label, _, _, result in scans:
        for path, line in result.escaped.items():
            escaped.setdefault(path, f"{label}, line {line}" if line else label)
    writer = next(((label, w) for label, _, _, r in scans for w in r.code_writes), None)
    for label, grade_id, is_cell, result in scans:
        if writer and result.unresolved:   # code written while the notebook runs, then imported
            (line, module), (where, (wline, shown)) = result.unresolved[0], writer
            ban(all_tests, f"{label}, line {line}: imports {module}, which is neither installed nor a file of the "
                           f"submission, and {where}, line {wline} writes a file at run time ({shown}): the grader "
                           "cannot check code written while the notebook runs; submit it as a .py file")
        written = _written_into(escaped, result.untyped_writes)
        if written:
            ban(all_tests, f"{label}, line {written[0]}: assigns to {written[1]} through a name the grader cannot "
                           f"follow ({escaped[written[1].rsplit('.', 1)[0]]} hands the module away): replacing "
                           "parts of a library module is not allowed (tampering)")
        if result.findings:
            first = result.findings[0]
            line = result.lines.get(first)
            ban(all_tests, f"{label}, line {line}: {first}" if line else f"{label} {first}")
        hits = list(result.hits)
        why = [result.reasons[e] for e in hits if e in result.reasons][:1]
        if escaped and result.opaque:   # getattr(x, name) where x could be a module handed away
            where, path = next((w, p) for p, w in escaped.items())
            line, shown = result.opaque[0]
            carried = [e for e in forbid if e.split(".")[0] in {p.split(".")[0] for p in escaped}]
            hits += [e for e in carried if e not in hits]
            why = why or [f"line {line}: {shown} looks up an attribute by a name computed at run time, on an object "
                          f"that could be {path} ({where} hands it to code the grader cannot follow)"]
        if hits:
            message = f"{label} uses {', '.join(hits)}, which this lab forbids" + (f" ({why[0]})" if why else "")
            ban(_affected(spec, grade_id, defines.get(label, set()), cells) if is_cell else all_tests, message)
    return banned


def _written_into(escaped: dict[str, str], writes) -> tuple[int, str] | None:
    """(line, module.attribute) of the first write, on an object the scan cannot type, of an
    attribute that a module handed away (`escaped`) holds code under: `def patch(m): m.run = fake`
    with `patch(camplib.dist.harness)`. A computed attribute name counts for any of them."""
    for line, attr in writes:
        for path in escaped:
            obj = resolve(path)
            if attr is None or callable(getattr(obj, attr, None)):   # what tampering replaces: code
                return line, f"{path}.{attr or '<computed name>'}"
    return None


def _defines(cells) -> dict[str, set[str]]:
    out = {}
    for label, source, _ in cells:
        try:
            tree = ast.parse(_ipython_transform(source))
        except (SyntaxError, ValueError):
            continue
        out[label] = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))} \
            | {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    return out


def _affected(spec: LabSpec, grade_id: str | None, names: set[str], cells) -> list[str]:
    """Tests of the exercise `grade_id` plus those of every solution cell that (transitively)
    uses a name this cell defines; every test when the cell is not a solution cell."""
    if not grade_id or grade_id not in spec.solution_tests:
        return [t.grade_id for t in spec.tests]
    tests = list(spec.solution_tests.get(grade_id, []))
    tainted, changed = set(names), True
    done = {grade_id}
    while changed:
        changed = False
        for label, source, gid in cells:
            if not gid or gid in done or gid not in spec.solution_tests:
                continue
            try:
                used = {n.id for n in ast.walk(ast.parse(_ipython_transform(source))) if isinstance(n, ast.Name)}
            except (SyntaxError, ValueError):
                continue
            if used & tainted:
                done.add(gid)
                tests += spec.solution_tests[gid]
                tainted |= _defines([(label, source, gid)]).get(label, set())
                changed = True
    return list(dict.fromkeys(tests))
