"""No import cycles inside camplib/ and autograder/.

Every import statement counts, wherever it is: at module level, inside a function (an import
moved into a function body is how a cycle usually hides: it still couples the two modules both
ways, and breaks as soon as somebody hoists it) and under `if TYPE_CHECKING:`. Relative imports
are resolved; `from pkg import name` counts `pkg` and, when it is a module, `pkg.name`.
Importing a module does not count as importing its parent package here (a package's __init__
running first is Python's order, not a dependency one can invert). Imports by string
(`importlib.import_module("...")`) are not seen. ~0.3 s.
"""
from __future__ import annotations

import ast
from pathlib import Path

from autograder.isolation.course_tree import imported_names

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("camplib", "autograder")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, known) -> set[str]:
    """Our modules that `path`'s import statements name, anywhere in it (the longest known prefix
    of each dotted name, as autograder.isolation.course_tree reads imports)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for dotted in imported_names(ast.parse(path.read_text(encoding="utf-8")), package, in_functions=True):
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in known:
                found.add(".".join(parts[:i]))
                break
    return found - {name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_cycles():
    """It can fail: a two-module and a three-module loop beside an acyclic part."""
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set(), "x": {"y"}, "y": {"z"}, "z": {"x"}}
    assert sorted(cycles(graph)) == [["a", "b"], ["x", "y", "z"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    assert "camplib.model" in graph["camplib.parallel.planner"]          # module level, absolute
    assert "camplib.parallel.zero.optimizer" in graph["camplib.parallel.zero.run"]   # inside a function
    assert "autograder.grading.entries" in graph["autograder.grading.observe"]       # relative


def test_no_import_cycles_in_camplib_and_autograder():
    found = cycles(import_graph())
    assert found == [], "import cycles (every import counts, function-level ones too): " + \
        "; ".join(" <-> ".join(c) for c in found)
