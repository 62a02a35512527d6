"""Per-lab forbidden APIs (course/labs.toml `forbid`): the things that would trivialise a lab,
e.g. `torch.nn.functional.scaled_dot_product_attention` in the attention lab.

Two checks, because each alone is easy to dodge:
- in the source: every dotted name the student's cells use, with import aliases resolved, and
  every string or attribute that spells a forbidden name's last part (getattr tricks);
- in the calls made: inside the student's process, forbidden functions and classes are wrapped
  so that using them is recorded while a test is running.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect


def static_uses(source: str, forbid: list[str]) -> list[str]:
    """Forbidden names that `source` (one cell) uses, resolved through imports and aliases."""
    try:
        tree = ast.parse(_strip_magics(source))
    except SyntaxError:
        return []
    aliases: dict[str, str] = {}
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                used.add(a.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                used.add(f"{node.module}.{a.name}")
    for node in ast.walk(tree):
        name = _dotted(node, aliases)
        if name:
            used.add(name)
    spelled = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    spelled |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    hits = []
    for entry in forbid:
        by_import = any(u == entry or u.startswith(entry + ".") for u in used) \
            or entry.rpartition(".")[0] + ".*" in used
        by_spelling = not _is_module(entry) and entry.rsplit(".", 1)[-1] in spelled
        if by_import or by_spelling:
            hits.append(entry)
    return hits


def _is_module(entry: str) -> bool:
    try:
        return importlib.util.find_spec(entry) is not None
    except (ImportError, ValueError):
        return False


def _dotted(node, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or not parts:
        return None
    head = aliases.get(node.id, node.id)
    return ".".join([head] + parts[::-1])


def _strip_magics(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _resolve(dotted: str):
    """The object named by `dotted`: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name, None)
        return obj
    return None


class Tripwires:
    """Wrap forbidden callables in this process so that calling them is recorded in `hits`."""

    def __init__(self, forbid: list[str]):
        self.hits: set[str] = set()
        for entry in forbid:
            try:
                self._arm(entry)
            except Exception:  # an entry that cannot be armed is still caught by the source scan
                pass

    def reset(self) -> None:
        self.hits.clear()

    def _arm(self, entry: str) -> None:
        try:  # a module: wrap everything public it defines
            module = importlib.import_module(entry)
        except ImportError:
            module = None
        if module is not None:
            for name, obj in vars(module).items():
                if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)) \
                        and getattr(obj, "__module__", "") == module.__name__:
                    setattr(module, name, self._wrap(obj, entry))
            return
        owner_name, _, attr = entry.rpartition(".")
        owner = _resolve(owner_name)  # a module (torch.nn.functional) or a class (torch.Tensor)
        if owner is not None and hasattr(owner, attr):
            setattr(owner, attr, self._wrap(getattr(owner, attr), entry))

    def _wrap(self, obj, entry: str):
        hits = self.hits
        if inspect.isclass(obj):
            original_init = obj.__init__

            def __init__(self_, *args, **kwargs):
                hits.add(entry)
                original_init(self_, *args, **kwargs)
            try:
                return type(obj.__name__, (obj,), {"__init__": __init__, "__module__": obj.__module__,
                                                   "__qualname__": obj.__qualname__})
            except (TypeError, AttributeError):  # final classes, enums with members: leave as is
                return obj

        def wrapper(*args, **kwargs):
            hits.add(entry)
            return obj(*args, **kwargs)
        wrapper.__wrapped__ = obj
        wrapper.__name__ = getattr(obj, "__name__", "wrapped")
        return wrapper
