"""Which of the course library's modules a lab's sandbox holds.

camplib implements every exercise, so a sandbox that could read all of it would hand a
submission the answer key (to read, to call, or to copy beside the notebook). A lab's sandbox
therefore binds camplib without the modules the lab forbids by name (course/labs.toml `forbid`
entries that are camplib modules or packages): inside, they do not exist (ImportError, no file
to read, no compiled copy in __pycache__).

A forbidden module stays only where the course itself needs it in the student's process: the
runners and classes the lab's tests build there (`make("camplib....")`) and the imports of the
course-written cells that run there (setup and locked cells, not demos tagged `skip-grading`,
not the student's solution cells), followed through camplib's module-level imports (an import
inside a library function that a runner reaches, of a module the lab forbids, shows up as the
reference solution losing points in tests/course/test_labs.py). So do the modules the lab's
catalog `notes` allow students to import, with what they import: an honest import never fails.
p03's harness, say, plugs the library's block manager in where a test grades the student's
scheduler alone, and a07 allows `camplib.quant.layers`, which imports the quantization formats:
those sandboxes keep them. `exposed(...)` names such modules.

Everything here is computed from the grader's own files (camplib's source, the lab's source
notebook), never from the submission.
"""
from __future__ import annotations

import ast
import os
import re
from functools import lru_cache
from pathlib import Path


PACKAGE = "camplib"
_DOTTED = re.compile(rf"^{PACKAGE}(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def package_dir() -> Path:
    import camplib
    return Path(camplib.__file__).resolve().parent


@lru_cache(maxsize=1)
def module_graph() -> dict[str, frozenset[str]]:
    """camplib module -> the camplib modules importing it loads (parent packages included):
    its module-level imports, not those inside its functions."""
    root = package_dir()
    files = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        files[name] = path
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for dotted in imported_names(ast.parse(path.read_text(encoding="utf-8")), package):
            found.update(_modules_of(dotted, files))
        graph[name] = frozenset(found - {name})
    return graph


def imported_names(tree: ast.AST, package: str, in_functions: bool = False):
    """Dotted names the statements of `tree` import (relative ones resolved against `package`),
    outside function bodies unless `in_functions`; `from pkg import x` yields `pkg` and `pkg.x`."""
    for node in (ast.walk(tree) if in_functions else _outside_functions(tree)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)   # `from pkg import submodule`


def _outside_functions(tree: ast.AST):
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(child for child in ast.iter_child_nodes(node)
                    if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def _modules_of(dotted: str, modules) -> set[str]:
    """The camplib modules importing `dotted` loads: its longest module prefix and the packages above."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return set()
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in modules:
            return {".".join(parts[:j]) for j in range(1, i + 1)}
    return set()


def closure(modules) -> set[str]:
    graph = module_graph()
    seen: set[str] = set()
    todo = [m for m in modules if m in graph]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name] - seen)
    return seen


@lru_cache(maxsize=64)
def course_needs(source_notebook: str) -> frozenset[str]:
    """camplib modules the course's own code loads in the student's process for this lab: what
    its cells hand to `make` (any camplib name written in a test cell) and what its
    course-written cells import (not its solution cells: those are the student's)."""
    import nbformat   # here, not at the top: reading a notebook is the only use, and nbformat imports jsonschema

    nb = nbformat.read(source_notebook, as_version=4)
    modules = module_graph()
    needs: set[str] = {PACKAGE}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") or "skip-grading" in cell.metadata.get("tags", []):
            continue   # the student's code, and demos that never run during grading
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:   # IPython magics: only the names matter here
            tree = None
        texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)] \
            if tree is not None else re.findall(r"[\"']([\w.]+)[\"']", cell.source)
        for text in texts:
            if _DOTTED.match(text):
                needs |= _modules_of(text, modules)
        if meta.get("grade") or tree is None:
            continue   # test cells import in the trusted process
        for dotted in imported_names(tree, ""):
            needs |= _modules_of(dotted, modules)
    return frozenset(needs)


def forbidden_modules(forbid) -> set[str]:
    """camplib modules and packages (with everything under them) that `forbid` names."""
    graph = module_graph()
    named = {e for e in forbid if e in graph}
    return {m for m in graph if any(m == e or m.startswith(e + ".") for e in named)}


def named_modules(text: str) -> set[str]:
    """camplib modules (and their packages) that `text` names, e.g. a lab's catalog `notes`
    ("`camplib.quant.layers` is yours to use")."""
    modules = module_graph()
    return {m for name in re.findall(rf"{PACKAGE}(?:\.\w+)+", text) for m in _modules_of(name, modules)}


def kept_modules(forbid, source_notebook: str | os.PathLike, notes: str = "") -> set[str]:
    """What the lab's sandbox must hold: the course's own needs there and what its `notes` allow
    students to import (a forbidden module the notes name is named as not theirs), with
    everything those import at module level."""
    allowed = named_modules(notes) - forbidden_modules(forbid)
    return closure(course_needs(str(source_notebook)) | allowed)


def hidden_modules(forbid, source_notebook: str | os.PathLike, notes: str = "") -> tuple[str, ...]:
    """The forbidden camplib modules this lab's sandbox leaves out."""
    return tuple(sorted(forbidden_modules(forbid) - kept_modules(forbid, source_notebook, notes)))


def exposed(forbid, source_notebook: str | os.PathLike, notes: str = "") -> tuple[str, ...]:
    """Forbidden camplib modules the sandbox keeps because the course's code there needs them,
    or a module the lab's notes allow imports them."""
    return tuple(sorted(forbidden_modules(forbid) & kept_modules(forbid, source_notebook, notes)))


def bwrap_binds(hidden) -> list[str]:
    """bwrap arguments that replace camplib, at its own path, by a read-only tree without the
    `hidden` modules (a tmpfs holding binds of everything else); none when nothing is hidden.
    Folders that hold a hidden module are rebuilt entry by entry, without their __pycache__."""
    hidden = set(hidden)
    if not hidden:
        return []
    root = package_dir()
    rebuilt = {PACKAGE} | {".".join(m.split(".")[:i]) for m in hidden for i in range(1, len(m.split(".")))}
    args = ["--perms", "0755", "--tmpfs", str(root)]

    def fill(folder: Path, package: str) -> None:
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                is_dir = entry.is_dir(follow_symlinks=False)
                if entry.name == "__pycache__":
                    continue
                module = f"{package}.{entry.name.removesuffix('.py') if not is_dir else entry.name}"
                if module in hidden:
                    continue
                target = str(root / Path(entry.path).relative_to(root))
                if is_dir and module in rebuilt:
                    args.extend(["--perms", "0755", "--dir", target])
                    fill(Path(entry.path), module)
                else:
                    args.extend(["--ro-bind", entry.path, target])

    fill(root, PACKAGE)
    return args + ["--remount-ro", str(root)]
