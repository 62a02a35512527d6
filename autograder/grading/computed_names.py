"""What an attribute name computed at run time can be, read from the source without running it.

`getattr(x, 'soft' + 'max')`, `getattr(x, f"{a}max")`, `getattr(x, ''.join(reversed('xamtfos')))`:
the forbidden-API scan (forbid.py) folds what is written in literals (concatenation, f-strings,
joins, `%`/`.format`, slices, `reversed`, `chr`, case changes, `.replace`) into a regular expression
of the names the expression can produce, with `.*` where a part is only known at run time. A plain
variable the source never builds from strings (a parameter, a name unpacked from a call, a loop
over data) is opaque (`None`): honest code looks attributes up by such names all the time
(`getattr(parent, child)` over a model's modules), so the scan only denies those where the object
could carry a forbidden API.
"""
from __future__ import annotations

import ast
import re

ANY = ".*"
_CASE = {"lower": str.lower, "upper": str.upper, "title": str.title, "capitalize": str.capitalize,
         "swapcase": str.swapcase, "casefold": str.casefold, "strip": str.strip, "lstrip": str.lstrip,
         "rstrip": str.rstrip}
_BUILDERS = set(_CASE) | {"join", "format", "replace", "removeprefix", "removesuffix", "decode", "encode",
                          "format_map", "zfill", "center", "ljust", "rjust", "translate"}


def string_assignments(tree: ast.AST) -> dict[str, ast.AST | None]:
    """name -> the expression assigned to it, for names assigned once (None when assigned more
    than once, or by unpacking: the scan then cannot tell which value reaches a lookup). Loop
    variables over a literal list/tuple map to that list."""
    env: dict[str, ast.AST | None] = {}

    def bind(target, value):
        if isinstance(target, ast.Name):
            env[target.id] = value if target.id not in env else None
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                bind(t, None)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                bind(t, node.value)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            bind(node.target, node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            env[node.target.id] = None
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            if _is_call(node.iter, "enumerate") and isinstance(node.target, ast.Tuple) and len(node.target.elts) == 2:
                bind(node.target.elts[0], _RANGE)
                bind(node.target.elts[1], None)
            else:
                bind(node.target, node.iter if isinstance(node.iter, (ast.List, ast.Tuple, ast.Set))
                     or _is_call(node.iter, "range") else None)
    return env


_RANGE = ast.Call(func=ast.Name(id="range", ctx=ast.Load()), args=[], keywords=[])


def _is_call(node, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def _counter(node, env) -> bool:
    """A loop counter (`for i in range(n)`, `for i, _ in enumerate(xs)`): digits when formatted."""
    return isinstance(node, ast.Name) and _is_call(env.get(node.id), "range")


def name_pattern(node: ast.AST, env: dict[str, ast.AST | None], _depth: int = 0) -> str | None:
    """A regular expression (fullmatch) for the strings `node` can evaluate to, or None when it is
    an opaque variable (see the module docstring). A literal gives its escaped self."""
    if _depth > 20:
        return ANY
    again = lambda n: name_pattern(n, env, _depth + 1)   # noqa: E731

    def part(n):                   # inside a built string, an opaque piece is anything
        p = again(n)
        return ANY if p is None else p

    if isinstance(node, ast.Constant):
        return re.escape(node.value) if isinstance(node.value, str) else (
            re.escape(str(node.value)) if isinstance(node.value, (int, float, bytes)) else ANY)
    if isinstance(node, ast.Name):
        if node.id in env and env[node.id] is not None:
            value = env[node.id]
            if _is_call(value, "range"):
                return r"-?\d+"
            if isinstance(value, (ast.List, ast.Tuple, ast.Set)):      # a loop variable over literals
                return "(?:" + "|".join(f"(?:{part(e)})" for e in value.elts) + ")" if value.elts else None
            return again(value) if _builds_string(value, env) else None
        return None
    if isinstance(node, ast.JoinedStr):
        return "".join(part(v.value) if isinstance(v, ast.FormattedValue) else part(v) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return r"-?\d+" if _counter(node.value, env) else part(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return part(node.left) + part(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Mult)):
        folded = _literal(node, env=env)
        return re.escape(folded) if isinstance(folded, str) else ANY
    if isinstance(node, ast.Subscript):        # 'xamtfos'[::-1], names[0]
        folded = _literal(node, env=env)
        if isinstance(folded, str):
            return re.escape(folded)
        return ANY
    if isinstance(node, ast.Call):
        folded = _literal(node, env=env)
        if isinstance(folded, str):
            return re.escape(folded)
        if _is_call(node, "str") and len(node.args) == 1 and _counter(node.args[0], env):
            return r"-?\d+"
        return ANY
    if isinstance(node, (ast.IfExp,)):
        return f"(?:(?:{part(node.body)})|(?:{part(node.orelse)}))"
    if isinstance(node, ast.BoolOp):
        return "(?:" + "|".join(f"(?:{part(v)})" for v in node.values) + ")"
    return ANY


def _builds_string(node: ast.AST, env) -> bool:
    """The expression is made from strings in the source (not a call to arbitrary code, an
    unpacking, or data read at run time)."""
    if isinstance(node, (ast.Constant, ast.JoinedStr)):
        return True
    if isinstance(node, ast.BinOp):
        return _builds_string(node.left, env) or _builds_string(node.right, env)
    if isinstance(node, ast.Subscript):
        return _builds_string(node.value, env)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _BUILDERS:
            return True
        return isinstance(func, ast.Name) and func.id in ("str", "chr", "reversed", "format", "bytes")
    if isinstance(node, ast.Name):
        value = env.get(node.id)
        return value is not None and _builds_string(value, env)
    if isinstance(node, (ast.IfExp, ast.BoolOp)):
        return True
    return False


def _literal(node: ast.AST, _depth: int = 0, env=None):
    """The value of an expression made only of literals and a few pure string operations (None
    when any part is not): `'soft' + 'max'`, `''.join(reversed('xamtfos'))`, `chr(115) + 'oftmax'`,
    `'%smax' % 'soft'`, `'{}max'.format('soft')`, `'SOFTMAX'.lower()`, `'xamtfos'[::-1]`."""
    if _depth > 20:
        return None
    lit = lambda n: _literal(n, _depth + 1, env)   # noqa: E731
    if isinstance(node, ast.Name) and env and env.get(node.id) is not None and _builds_string(env[node.id], env):
        return lit(env[node.id])
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, bytes)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [lit(e) for e in node.elts]
        return None if any(i is None for i in items) else items
    if isinstance(node, ast.JoinedStr):
        parts = [lit(v.value) if isinstance(v, ast.FormattedValue) else lit(v) for v in node.values]
        return None if any(p is None for p in parts) else "".join(str(p) for p in parts)
    if isinstance(node, ast.BinOp):
        a, b = lit(node.left), lit(node.right)
        if a is None or b is None:
            return None
        try:
            if isinstance(node.op, ast.Add) and type(a) is type(b):
                return a + b
            if isinstance(node.op, ast.Mult) and isinstance(a, (str, bytes)) and isinstance(b, int) and b < 256:
                return a * b
            if isinstance(node.op, ast.Mod) and isinstance(a, str):
                return a % (tuple(b) if isinstance(b, list) else b)
        except (TypeError, ValueError):
            return None
        return None
    if isinstance(node, ast.Subscript):
        value = lit(node.value)
        if not isinstance(value, (str, bytes, list)):
            return None
        s = node.slice
        try:
            if isinstance(s, ast.Slice):
                bounds = [None if x is None else lit(x) for x in (s.lower, s.upper, s.step)]
                if any(x is not None and not isinstance(x, int) for x in bounds):
                    return None
                return value[slice(*bounds)]
            index = lit(s)
            return value[index] if isinstance(index, int) else None
        except (IndexError, ValueError):
            return None
    if isinstance(node, ast.Call) and not node.keywords:
        func = node.func
        args = [lit(a) for a in node.args]
        if any(a is None for a in args):
            return None
        if isinstance(func, ast.Name):
            if func.id == "chr" and len(args) == 1 and isinstance(args[0], int) and 0 <= args[0] < 0x110000:
                return chr(args[0])
            if func.id in ("reversed", "list") and len(args) == 1 and isinstance(args[0], (str, list)):
                return list(reversed(args[0])) if func.id == "reversed" else list(args[0])
            if func.id == "str" and len(args) == 1 and isinstance(args[0], (str, int)):
                return str(args[0])
            return None
        if isinstance(func, ast.Attribute):
            owner = lit(func.value)
            try:
                if isinstance(owner, str) and func.attr == "join" and len(args) == 1 and isinstance(args[0], (list, str)) \
                        and all(isinstance(a, str) for a in args[0]):
                    return owner.join(args[0])
                if isinstance(owner, str) and func.attr in _CASE and not args:
                    return _CASE[func.attr](owner)
                if isinstance(owner, str) and func.attr == "replace" and len(args) == 2 and all(isinstance(a, str) for a in args):
                    return owner.replace(*args)
                if isinstance(owner, str) and func.attr == "format" and all(isinstance(a, (str, int)) for a in args):
                    return owner.format(*args)
                if isinstance(owner, bytes) and func.attr == "decode" and not args:
                    return owner.decode("utf-8", "replace")
                if isinstance(owner, str) and func.attr in ("removeprefix", "removesuffix") and len(args) == 1:
                    return getattr(owner, func.attr)(args[0])
            except (TypeError, ValueError, IndexError, KeyError):
                return None
    return None


def literal_name(node: ast.AST, env: dict[str, ast.AST | None]) -> str | None:
    """The name when the expression always evaluates to one string known from the source."""
    value = _literal(node, env=env)
    return value if isinstance(value, str) else None


def could_be(pattern: str, names) -> list[str]:
    """The names among `names` that a string matching `pattern` could be."""
    try:
        rx = re.compile(pattern, re.S)
    except re.error:
        return list(names)
    return [n for n in names if rx.fullmatch(n)]
