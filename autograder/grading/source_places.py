"""Where a node stands in the source, read from syntax alone: what the forbidden-API scan
(forbid.py) needs to tell a use from a mention. Is a name only type-tested or annotated
(`isinstance(f, types.FunctionType)`), called, handed to code the scan cannot follow (an argument,
a return value, an attribute stored), bound to what (`m = ...`, `for m in ...`, a default), is a
module's namespace only read, is a write a constant setting, does a call write a file Python could
import. The scan's policy (what counts as forbidden or tampering) stays in forbid.py."""
from __future__ import annotations

import ast

_TYPE_TESTS = {"isinstance", "issubclass"}
_NAMESPACE_WRITES = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


_IMPORTABLE = (".py", ".pyc", ".so", ".pth", ".pyd", ".zip", ".egg", ".whl")


_FILE_MAKERS = {"shutil.copy", "shutil.copyfile", "shutil.copy2", "shutil.copytree", "shutil.move", "os.rename",
                "os.replace", "os.link", "os.symlink", "os.write", "shutil.unpack_archive"}


def writes_code(node: ast.Call, name: str | None, literal) -> bool:
    """The call may write a file Python could import (a .py written by `open(..., 'w')`,
    `Path.write_text`, a copy or move): a literal target with another suffix (`log.json`,
    `fig.png`) does not count, a computed one does."""
    def importable(target) -> bool:
        path = literal(target) if target is not None else None
        return path is None or path.endswith(_IMPORTABLE) or "." not in path.rsplit("/", 1)[-1]

    if name in ("open", "io.open", "builtins.open", "os.open") and node.args:
        mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg in ("mode", "flags")), None)
        text = literal(mode) if mode is not None else "r"
        writes = name == "os.open" or text is None or any(c in text for c in "wax+")
        return writes and importable(node.args[0])
    if name in _FILE_MAKERS:
        return importable(node.args[1] if len(node.args) > 1 else None)
    if isinstance(node.func, ast.Attribute) and node.func.attr in ("write_text", "write_bytes", "symlink_to",
                                                                   "hardlink_to", "extractall"):
        owner = node.func.value     # Path('helpers.py').write_text(...)
        if isinstance(owner, ast.Call) and owner.args and node.func.attr.startswith(("write", "symlink", "hardlink")):
            return importable(owner.args[-1])
        return True
    return False


def magic_statement(line: str) -> str:
    """The Python statement of a `%time`/`%timeit` line, its options (`-n 1 -r 3`, `-q`, `-o`)
    left out."""
    text = line.lstrip()
    while text.startswith("-"):
        option, _, rest = text.partition(" ")
        text = rest.lstrip()
        if option in ("-n", "-r", "-p") and text.split(" ", 1)[0].isdigit():
            text = text.partition(" ")[2].lstrip()
    return text


def bound(node) -> tuple[list[str], ast.AST | None]:
    """(names, the value they are bound to) for a binding statement or expression."""
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)], node.value
    if isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and isinstance(node.target, ast.Name) and node.value is not None:
        return [node.target.id], node.value
    if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
        return [n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)], node.iter
    if isinstance(node, ast.arguments):      # `def f(m=torch)`: every defaulted parameter may hold any default
        names = [a.arg for a in node.args + node.kwonlyargs]
        defaults = [None] * (len(node.args) - len(node.defaults)) + list(node.defaults) + list(node.kw_defaults)
        given = [(n, d) for n, d in zip(names, defaults) if d is not None]
        if given:
            return [n for n, _ in given], ast.Tuple(elts=[d for _, d in given], ctx=ast.Load())
    return [], None


def method_self(node) -> bool:
    """`node` is the first parameter of the method it is in (`self.x = ...` in a class body's
    function): the instance's own attribute, not a module's."""
    if not isinstance(node, ast.Name):
        return False
    scope = parent_of(node)
    while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        scope = parent_of(scope)
    return (scope is not None and isinstance(parent_of(scope), ast.ClassDef) and bool(scope.args.args)
            and scope.args.args[0].arg == node.id and not any(
                isinstance(d, ast.Name) and d.id == "staticmethod" for d in scope.decorator_list))


def parent_of(node):
    return getattr(node, "_camp_parent", None)


def called(node) -> bool:
    parent = parent_of(node)
    return isinstance(parent, ast.Call) and parent.func is node


def type_test(node) -> bool:
    """`node` is only compared or type-tested: isinstance/issubclass's class argument (alone or in
    a tuple), an operand of `is`/`==`/`in`, or an annotation."""
    child, parent = node, parent_of(node)
    while isinstance(parent, (ast.Tuple, ast.List, ast.Set)) or (isinstance(parent, ast.BinOp)
                                                                  and isinstance(parent.op, ast.BitOr)):
        child, parent = parent, parent_of(parent)
    if isinstance(parent, ast.Call) and callee(parent) in _TYPE_TESTS and child in parent.args[1:]:
        return True
    if isinstance(parent, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                               for op in parent.ops):
        return True
    if isinstance(parent, ast.Subscript) and child is parent.slice:    # Optional[FunctionType], Callable[...]
        return type_test(parent) or annotation(parent)
    return annotation(child)


def annotation(node) -> bool:
    parent = parent_of(node)
    while isinstance(parent, (ast.Subscript, ast.Tuple, ast.BinOp, ast.Attribute)):
        node, parent = parent, parent_of(parent)
    return (isinstance(parent, ast.arg) and parent.annotation is node) or \
        (isinstance(parent, ast.AnnAssign) and parent.annotation is node) or \
        (isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and parent.returns is node)


# Builtins that only look at what they are given (`dir(torch)`, `help(F)`): handing a module to
# them hands it to no one.
_LOOKS_ONLY = _TYPE_TESTS | {"type", "id", "print", "repr", "str", "hash", "callable", "dir", "help", "len", "bool",
                             "format"}


def escapes(node) -> bool:
    """The value of `node` goes where the scan cannot follow it: a call's argument (but a type
    test's), a return or yield, an attribute or item stored, a class base, a default."""
    parent = parent_of(node)
    if isinstance(parent, ast.Call):
        return node is not parent.func and callee(parent) not in _LOOKS_ONLY
    if isinstance(parent, ast.keyword):
        return isinstance(parent_of(parent), ast.Call) and callee(parent_of(parent)) not in _TYPE_TESTS
    if isinstance(parent, (ast.Return, ast.Yield, ast.YieldFrom, ast.Lambda)):
        return True
    if isinstance(parent, ast.ClassDef):
        return node in parent.bases
    if isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node is parent.value:
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        return any(not isinstance(t, ast.Name) for t in targets) or isinstance(parent_of(parent), ast.ClassDef)
    return False


_READ_METHODS = {"get", "keys", "items", "values", "copy", "__contains__", "__getitem__", "__len__", "__iter__"}
_READ_CALLS = {"list", "dict", "sorted", "len", "set", "tuple", "print", "repr", "str", "iter", "any", "all", "enumerate"}


def namespace_read(node) -> bool:
    """`vars(m)` / `m.__dict__` only read where it stands (an item read, a read method, a loop,
    `in`, a copy); a write method or a store is checked elsewhere (check_call, check_write)."""
    parent = parent_of(node)
    if isinstance(parent, ast.Subscript) and parent.value is node:
        return True
    if isinstance(parent, ast.Attribute) and parent.value is node:
        return parent.attr in _READ_METHODS or parent.attr in _NAMESPACE_WRITES
    if isinstance(parent, (ast.For, ast.AsyncFor, ast.comprehension)) and parent.iter is node:
        return True
    if isinstance(parent, ast.Compare):
        return True
    if isinstance(parent, ast.Call) and node in parent.args:
        return callee(parent) in _READ_CALLS
    return False


def namespace_of(node):
    """X for `X.__dict__` and `vars(X)`, else None."""
    if isinstance(node, ast.Attribute) and node.attr == "__dict__":
        return node.value
    if isinstance(node, ast.Call) and callee(node) == "vars" and node.args:
        return node.args[0]
    return None


def constant(node) -> bool:
    """A plain constant (a setting: `True`, `64`, `"high"`, `(1, 2)`, `-1.5`)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
        return constant(node.operand)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(constant(e) for e in node.elts)
    return False


def callee(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else None


def const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
