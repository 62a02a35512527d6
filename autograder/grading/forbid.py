"""Per-lab forbidden APIs (course/labs.toml `forbid`): the things that would trivialise a lab,
e.g. `torch.nn.functional.scaled_dot_product_attention` in the attention lab.

This is the trusted, static half (the grader runs it on the submission's files before any of
the student's code runs); `observe` is the runtime half inside the student's process, which the
grader validates with canaries but never relies on alone.

A forbidden entry is caught under any name that reaches it:
- the dotted name, through imports, aliases, `getattr` with constant names and `__dict__[...]`;
- another public or private name of the same thing: `torch._C._nn.softmax`, `nn.Softmax`,
  `torch.ops.aten._safe_softmax`, `aten._scaled_dot_product_flash_attention` (`entries.alias_of`);
- a Tensor method spelled like it (`x.softmax(-1)`), unless the student defines that attribute
  themselves (their own `self.softmax` is theirs; the runtime observer still watches the call).
Names computed at run time are denied by default where they could reach one (computed_names
folds what is written in literals first: `'soft' + 'max'` is the literal `softmax`): a name
known only at run time looked up on a module or class carrying a forbidden entry (reached by
import, alias, `__import__`/`import_module`, `globals()[...]`, a container, a conditional or a
loop) is every forbidden entry of that package; on an object the scan cannot type, a partly
built name is matched against the forbidden names' spellings, and an opaque one counts only
when the submission hands such a module to code the scan cannot follow (static_check).
Besides forbidden names, the scan reports what would let code escape it (`findings`): source
it cannot parse after IPython's own transforms (a notebook cell like that is simply not run,
`unparsable_cell`; an importable .py file costs every test), magics and shell escapes that run code it
cannot see, exec/eval of computed strings, lookups by computed names on Python's own machinery
(sys, importlib, types...), `getattr`-like functions handed around as values, any write into a
library module or class (tampering: assignment, `del`, `setattr`, namespace updates; a constant
setting of a third-party module is not one), reloading library modules, reaching past wrappers
(`__wrapped__`, `__closure__`, gc), and touching the machinery that observes calls. Types that
make code only when called (`types.FunctionType`) are fine in type tests and annotations.
Findings and reasons name the line.
"""
from __future__ import annotations

import ast
import inspect
import re
import sys
from functools import lru_cache

from .computed_names import could_be, literal_name, name_pattern, string_assignments
from .entries import Rules, is_module, resolve, rules_for
from .source_places import (
    _NAMESPACE_WRITES,
    bound,
    callee,
    called,
    const_str,
    constant,
    escapes,
    magic_statement,
    method_self,
    namespace_of,
    namespace_read,
    type_test,
    writes_code,
)

# -- what counts as tampering --------------------------------------------------------------------

_REACH_PAST = {"__wrapped__", "__closure__", "__globals__", "__code__", "__builtins__", "__subclasses__",
               "cell_contents", "f_back", "f_globals", "f_locals", "gi_frame", "tb_frame", "__kwdefaults__",
               "__defaults__", "func_globals", "__getattribute__", "__loader__", "__spec__"}
_MACHINERY = re.compile(r"(torch_dispatch|_dispatch_|dispatch_mode|python_dispatch|DispatchKey|TorchDispatch|"
                        r"torch_function|TorchFunction|DisableTorch|setprofile|settrace|_getframe|currentframe|"
                        r"_current_frames|getclosurevars|^unwrap$|^_?push_mode$|^_?pop_mode$|_disable_current_modes|"
                        r"^(Observer|_OpObserver|Tripwires|called_by_student|canary\w*|_canary\w*|Runner|observer|"
                        r"tripwires|student_process|sandbox_init)$)")
# torch.distributed's collectives below the layers a rank's observer wraps (observe.py,
# collective_ops.py): the c10d operators by their Python names, the raw C++ module, torch's private
# constructors of fresh operators, C++ that calls collectives itself. Denied by attribute name
# (whatever the object) and for any path through torch._ops.
_BELOW_OBSERVED = {"c10d", "c10d_functional", "_c10d_functional", "_c10d_functional_autograd", "_dtensor",
                   "_distributed_c10d", "_OpNamespace", "OpOverloadPacket", "_jit_get_operation",
                   "_get_operation_overload", "_broadcast_coalesced", "_verify_params_across_processes"}
_BELOW_OBSERVED_PATHS = ("torch._ops", "torch.distributed.Reducer")
_OPAQUE_CALLS = {"exec", "eval", "compile", "__import__", "importlib.import_module", "importlib.__import__",
                 "builtins.exec", "builtins.eval", "builtins.compile"}
_LOADERS = {"importlib.reload", "imp.reload", "importlib.machinery", "importlib.util.spec_from_file_location",
            "importlib.util.module_from_spec", "importlib.util.spec_from_loader", "zipimport", "runpy", "imp",
            "marshal", "types.CodeType", "types.FunctionType", "types.ModuleType", "pickle.loads", "pickle.load",
            "pickle.Unpickler", "_pickle", "dill", "cloudpickle", "sys.modules", "sys.path", "sys.meta_path",
            "sys.path_hooks", "sys.setprofile", "sys.settrace", "threading.setprofile", "threading.settrace",
            "gc.get_objects", "gc.get_referents", "gc.get_referrers", "builtins", "ctypes.pythonapi",
            "torch.jit.load", "torch.jit.CompilationUnit", "torch.package"}   # TorchScript from a string or file
# Replace library attributes for a while (tampering whatever the target).
_PATCHERS = {"unittest.mock.patch", "mock.patch", "pytest.MonkeyPatch", "_pytest.monkeypatch", "pytest.monkeypatch"}
# Types that only make code when called: naming them in a type test (`isinstance(f, types.FunctionType)`,
# `type(f) is FunctionType`, an annotation) runs nothing.
_TYPE_ONLY = {"types.CodeType", "types.FunctionType", "types.ModuleType"}
# Modules whose attributes looked up by a computed name are an escape whatever the lab forbids.
_ESCAPE_HEADS = {"autograder", "sys", "builtins", "importlib", "gc", "imp", "zipimport", "runpy", "marshal", "types",
                 "pickle", "_pickle", "dill", "cloudpickle", "ctypes", "threading", "inspect", "operator", "functools"}
_DYNAMIC_LOOKUPS = {"getattr", "setattr", "delattr", "hasattr", "vars", "operator.attrgetter",
                    "operator.methodcaller", "inspect.getmembers", "inspect.getattr_static"}
# Lookups by name handed around as values (functools.reduce(getattr, ...), partial(setattr, m)):
# the scan cannot tell what they will look up.
_INDIRECT = {"getattr", "setattr", "delattr", "vars", "__import__", "exec", "eval", "compile", "globals", "locals",
             "operator.attrgetter", "operator.methodcaller", "operator.setitem", "operator.delitem",
             "importlib.import_module", "inspect.getattr_static", "inspect.getmembers"}
_SAFE_LINE_MAGICS = {"matplotlib", "pinfo", "pinfo2", "psearch", "precision", "pprint", "xmode", "who", "whos"}
_CODE_MAGICS = {"time", "timeit", "capture"}   # their argument or body is Python: scanned like a cell
_TAINT = "?"    # an alias whose value may be one of these library objects, computed: "?torch|camplib.dist"


class _Scan:
    """One pass over one source (a cell or a file), collecting forbidden entries and findings.
    `aliases` (local name -> library path, or _TAINT + paths for a name that may hold one of
    those modules or classes) carries imports from one cell to the next.

    Besides `hits` and `findings`: `reasons` (entry -> why, naming the line), `lines` (finding
    -> line), `escaped` (library modules/classes carrying forbidden entries that the source hands
    to code the scan cannot follow: as an argument, in a container, as a return value) and
    `opaque` (lines looking up an attribute by an opaque name on an object the scan cannot
    type), `untyped_writes` (line, attribute written on such an object; None: a computed name).
    Those are innocent unless a carrier escaped somewhere in the submission (static_check
    decides, over all of its sources)."""

    def __init__(self, rules: Rules, own: set[str], local_modules: set[str], aliases: dict[str, str]):
        self.rules, self.own, self.local, self.aliases = rules, own, local_modules, aliases
        self.hits: list[str] = []
        self.findings: list[str] = []
        self.reasons: dict[str, str] = {}
        self.lines: dict[str, int] = {}
        self.escaped: dict[str, int] = {}
        self.opaque: list[tuple[int, str]] = []
        self.untyped_writes: list[tuple[int, str | None]] = []
        self.unresolved: list[tuple[int, str]] = []      # imports of modules neither installed nor submitted
        self.code_writes: list[tuple[int, str]] = []     # files written at run time that Python could import
        self.env: dict = {}
        self.outer_line: int | None = None

    def line(self, node) -> int | None:
        return self.outer_line or getattr(node, "lineno", None)

    def hit(self, entries, why: str | None = None, node=None):
        for e in entries:
            if e not in self.hits:
                self.hits.append(e)
            if why and e not in self.reasons:
                line = self.line(node)
                self.reasons[e] = f"line {line}: {why}" if line else why

    def find(self, message: str, node=None):
        if message not in self.findings:
            self.findings.append(message)
            line = self.line(node)
            if line:
                self.lines[message] = line

    # names ---------------------------------------------------------------------------------------
    def dotted(self, node) -> str | None:
        """`a.b.c`, `getattr(a.b, 'c')`, `a.__dict__['c']`, `__import__('a').b`,
        `importlib.import_module('a.b')` and `globals()['a']` as "module.b.c" with imports
        resolved (names folded from literals, `'soft' + 'max'`, count as literals)."""
        parts = []
        while True:
            if isinstance(node, ast.Attribute) and node.attr != "__dict__":
                parts.append(node.attr)
                node = node.value
            elif (isinstance(node, ast.Call) and callee(node) == "getattr" and len(node.args) >= 2 and self.literal(node.args[1]) is not None):
                parts.append(self.literal(node.args[1]))
                node = node.args[0]
            elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                  and node.value.attr == "__dict__" and self.literal(node.slice) is not None):
                parts.append(self.literal(node.slice))
                node = node.value.value
            elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call)
                  and callee(node.value) in ("globals", "locals", "vars") and not node.value.args
                  and self.literal(node.slice) is not None):
                node = ast.Name(id=self.literal(node.slice), ctx=ast.Load())
            elif isinstance(node, ast.Call) and _imported(node, self.literal):
                head = _imported(node, self.literal)
                return ".".join([head] + parts[::-1]) if self.library(head) else None
            else:
                break
        if not isinstance(node, ast.Name):
            return None
        head = self.aliases.get(node.id)
        if head is None or head.startswith(_TAINT):
            return None
        return ".".join([head] + parts[::-1])

    def literal(self, node) -> str | None:
        return literal_name(node, self.env)

    def library(self, path: str | None) -> bool:
        return bool(path) and path.split(".")[0] not in self.local and path.split(".")[0] in _importable_heads(path)

    def carriers(self, node) -> set[str]:
        """Library modules and classes carrying forbidden entries (or the course's own packages)
        that the value of `node` may be: itself, an alias or tainted name, an element of a literal
        container, a branch of a conditional, `globals()`."""
        path = self.dotted(node)
        if path is not None:
            return {path} if self.library(path) and self.rules.carrier(path) else set()
        if isinstance(node, ast.Name):
            alias = self.aliases.get(node.id, "")
            return set(alias[1:].split("|")) if alias.startswith(_TAINT) else set()
        if isinstance(node, ast.Call) and callee(node) in ("globals", "locals", "vars") and not node.args:
            return self.namespace_carriers()
        if isinstance(node, ast.Call):
            return set()   # what a call returns is not the module it was called on
        if isinstance(node, (ast.Lambda, ast.Compare, ast.UnaryOp, ast.BinOp, ast.Constant, ast.JoinedStr,
                             ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return set()
        found: set[str] = set()
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.Subscript) and child is node.slice or isinstance(node, ast.Dict) and child in node.keys:
                continue
            if isinstance(child, ast.expr):
                found |= self.carriers(child)
        return found

    def namespace_carriers(self) -> set[str]:
        return {p for name, p in self.aliases.items() if not p.startswith(_TAINT) and self.library(p)
                and self.rules.carrier(p)} | {q for p in self.aliases.values() if p.startswith(_TAINT)
                                                for q in p[1:].split("|")}

    # the pass ------------------------------------------------------------------------------------
    def run(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                child._camp_parent = node
        self.env = string_assignments(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    self.check_path(a.name, node)
                    self.check_import(a.name, node)
            elif isinstance(node, ast.ImportFrom):
                if node.level:       # a relative import inside the submission's own package
                    continue
                module = node.module or ""
                self.check_import(module, node)
                for a in node.names:
                    if a.name == "*":
                        self.hit((e for e in self.rules.entries if e.rpartition(".")[0] == module
                                  or e.startswith(module + ".")), f"`from {module} import *`", node)
                        continue
                    self.aliases[a.asname or a.name] = f"{module}.{a.name}"
                    if f"{module}.{a.name}" not in _TYPE_ONLY:     # its uses are checked (visit)
                        self.check_path(f"{module}.{a.name}", node)
        for node in ast.walk(tree):   # aliases of library objects, then names that may hold one
            targets, value = bound(node)
            for target in targets:
                path = self.dotted(value) or (_imported(value, self.literal) if value is not None else None)
                if path and self.library(path):
                    self.aliases[target] = path             # `aten = torch.ops.aten`
                    continue
                held = self.carriers(value) if value is not None else set()
                if held:
                    self.aliases[target] = _TAINT + "|".join(sorted(held))   # `m = [torch][0]`, `for m in (F,)`
        for node in ast.walk(tree):
            self.visit(node)

    def check_import(self, module: str, node) -> None:
        head = module.split(".")[0]
        if head and head not in self.local and not self.library(head) and head not in sys.builtin_module_names:
            self.unresolved.append((self.line(node) or 0, module))

    def check_path(self, path: str, node=None) -> None:
        if not self.library(path):
            return
        self.hit(self.rules.by_path(path))
        parts = path.split(".")
        loader = next((".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in _LOADERS), None)
        if loader and not (loader in _TYPE_ONLY and node is not None and type_test(node)):
            self.find(f"uses {path}, which loads or replaces code the grader cannot check", node)
        if any(".".join(parts[:i]) in _PATCHERS for i in range(1, len(parts) + 1)):
            self.find(f"uses {path}, which replaces library functions while it is active (tampering)", node)
        below = next((p for p in parts if p in _BELOW_OBSERVED), None) or next(
            (b for b in _BELOW_OBSERVED_PATHS if path == b or path.startswith(b + ".")), None)
        if below:
            self.find(_below_message(path), node)
        if any(_MACHINERY.search(p) for p in parts) or (parts[0] == "autograder" and len(parts) > 1
                                                        and parts[1] not in ("checks", "text")):
            self.find(f"uses {path}, part of the machinery that observes calls during grading", node)

    def visit(self, node) -> None:
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            path = self.dotted(node)
            if path and self.library(path):
                self.check_path(path, node)
            elif path and path.split(".")[0] in self.local:
                pass   # an attribute of the submission's own module: scanned in its own file
            elif isinstance(node, ast.Attribute) and node.attr not in self.own:
                self.hit(self.rules.by_attribute(node.attr))
        if isinstance(node, ast.Attribute):
            self.attribute_name(node.attr, node)
            if node.attr == "__dict__":
                held = self.carriers(node.value)
                if held:
                    self.computed(held, node, f"{_show(node)} reads the namespace of {_names(held)}")
        namespace = namespace_of(node)
        if namespace is not None and not namespace_read(node):
            for owner in sorted(self.carriers(namespace) or self.library_owner(namespace)):
                self.find(f"hands the namespace of {owner} to code that could change it "
                          "(replacing parts of a library module is not allowed: tampering)", node)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            if node.id in _REACH_PAST:
                self.find(f"uses {node.id}, which reaches past the library's own functions", node)
            elif node.id == "get_ipython" and not _is_magic_call(node):
                self.find("uses get_ipython(), which can run code the grader cannot check", node)
            alias = self.aliases.get(node.id, "")
            if alias in _TYPE_ONLY and not type_test(node):
                self.check_path(alias, node)
            callee = node.id if node.id in _INDIRECT and node.id not in self.aliases else (
                alias if alias in _INDIRECT else None)
            if callee and not called(node) and not type_test(node):
                self.find(f"hands {callee} around as a value (reduce, partial, map...): "
                          "the grader cannot check what it looks up", node)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            path = self.dotted(node)
            if path in _INDIRECT and not called(node):
                self.find(f"hands {path} around as a value (reduce, partial, map...): "
                          "the grader cannot check what it looks up", node)
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.List, ast.Tuple, ast.Set, ast.Dict,
                             ast.IfExp, ast.BoolOp, ast.Starred)) and escapes(node):
            for path in self.carriers(node):     # modules only: a class handed to typing.cast or a
                if inspect.ismodule(resolve(path)):   # base class is everywhere in honest code
                    self.escaped.setdefault(path, self.line(node) or 0)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            value = None if isinstance(node, (ast.Delete, ast.AugAssign)) else node.value
            for t in targets:
                self.check_write(t, value, node)
        if isinstance(node, ast.Call):
            self.check_call(node)

    def attribute_name(self, attr: str, node) -> None:
        """An attribute read by this name, on whatever object: reaching past wrappers, into the
        observing machinery, below the collectives the grader observes."""
        if attr in _REACH_PAST:
            self.find(f"reads {attr}, which reaches past the library's own functions", node)
        elif _MACHINERY.search(attr):
            self.find(f"uses .{attr}, part of the machinery that observes calls during grading", node)
        elif attr in _BELOW_OBSERVED and attr not in self.own:
            self.find(_below_message("." + attr), node)

    def check_write(self, target, value, node) -> None:
        for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
            if isinstance(t, ast.Starred):
                t = t.value
            if isinstance(t, ast.Attribute):
                owners, attr = self.carriers(t.value) or self.library_owner(t.value), t.attr
                if not owners and self.dotted(t.value) is None and not method_self(t.value):
                    self.untyped_writes.append((self.line(node) or 0, attr))
            elif isinstance(t, ast.Subscript):
                namespace = t.value
                if isinstance(namespace, ast.Attribute) and namespace.attr == "__dict__":
                    owners, attr = self.carriers(namespace.value) or self.library_owner(namespace.value), None
                elif isinstance(namespace, ast.Call) and callee(namespace) == "vars" and namespace.args:
                    owners, attr = self.carriers(namespace.args[0]) or self.library_owner(namespace.args[0]), None
                else:
                    owner = self.dotted(namespace)   # a library object's own items (rcParams, os.environ)
                    owners = {owner} if self.library(owner) and _always_guarded(owner) else set()
                    attr = None
            else:
                continue
            for owner in sorted(owners):
                if self.replaces(owner, attr, value):
                    self.find(f"assigns to {owner}{'.' + attr if attr else '[...]'}: "
                              "replacing parts of a library module is not allowed (tampering)", node)

    def library_owner(self, node) -> set[str]:
        """{path} when `node` names a library module or class (a write into it is a write into
        the library), else empty."""
        path = self.dotted(node)
        return {path} if self.library(path) and _module_or_class(path) else set()

    def replaces(self, owner: str, attr: str | None, value=None) -> bool:
        """A write to `owner.attr` (`owner[...]` when attr is None) of `value` (None: unknown or a
        deletion) that could change what a library function does in the student's process.
        Allowed: a setting of a plain constant into a third-party module
        (`torch.backends.cudnn.deterministic = True`); a write into a library object's own
        items (`plt.rcParams['figure.figsize'] = ...`, `os.environ[...]`)."""
        if _always_guarded(owner):
            return True
        if attr is None:
            return _module_or_class(owner)
        path = f"{owner}.{attr}"
        if (self.rules.by_path(path) or self.rules.by_attribute(attr) or _MACHINERY.search(attr)
                or any(e.startswith(path + ".") for e in self.rules.entries) or owner.split(".")[0] == "autograder"):
            return True
        return _module_or_class(owner) and not (constant(value) and not _is_class(owner))   # a module's setting

    def check_call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute) and _is_get_ipython(node.func.value):
            self.magic(node, node.func.attr)
            return
        name = self.dotted(node.func) or callee(node)
        if name in _OPAQUE_CALLS:
            code = self.literal(node.args[0]) if node.args else None
            if name in ("exec", "eval", "compile") and code is not None:
                self.nested(code, node)
            elif name in ("__import__", "importlib.import_module") and code is not None:
                self.check_path(code, node)
                self.check_import(code, node)
            else:
                self.find(f"calls {name}() on a computed value: the grader cannot see what it runs", node)
        elif name in ("operator.attrgetter", "operator.methodcaller") and node.args:
            key = self.literal(node.args[0])
            if key is None:
                self.find(f"calls {name}() with a computed name: the grader cannot check it", node)
            else:
                self.hit(e for part in key.split(".") for e in self.rules.by_attribute(part) if part not in self.own)
                for part in key.split("."):
                    self.attribute_name(part, node)
        elif name in _DYNAMIC_LOOKUPS and node.args:
            self.dynamic_lookup(node, name)
        if writes_code(node, name, self.literal):
            self.code_writes.append((self.line(node) or 0, _show(node)))
        elif (isinstance(node.func, ast.Attribute) and node.func.attr in _NAMESPACE_WRITES
              and namespace_of(node.func.value) is not None):
            held = self.carriers(namespace_of(node.func.value)) or self.library_owner(namespace_of(node.func.value))
            for owner in sorted(held):
                self.find(f"changes the namespace of {owner} ({node.func.attr}): replacing parts of a library "
                          "module is not allowed (tampering)", node)
        elif (isinstance(node.func, ast.Attribute) and node.func.attr in ("__setattr__", "__delattr__")
              and node.args and (self.carriers(node.args[0]) or self.library_owner(node.args[0]))):
            self.find(f"calls {node.func.attr} on {_names(self.carriers(node.args[0]) or self.library_owner(node.args[0]))}: "
                      "replacing parts of a library module is not allowed (tampering)", node)

    def dynamic_lookup(self, node: ast.Call, name: str) -> None:
        """getattr/setattr/delattr/hasattr/vars/getmembers/getattr_static: a literal name is checked
        like an attribute; a computed one on a module or class carrying forbidden entries is denied
        (it could be any of them); on an object the scan cannot type, a name built from literals is
        matched against the forbidden names, an opaque one noted (see _Scan)."""
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            obj = ast.Tuple(elts=[a.value if isinstance(a, ast.Starred) else a for a in node.args]
                            + [k.value for k in node.keywords], ctx=ast.Load())
            key_node = ast.Name(id="\0unpacked", ctx=ast.Load())     # getattr(*args): the name is unknown
        else:
            obj = node.args[0]
            key_node = node.args[1] if len(node.args) > 1 else None
        held = self.carriers(obj)
        owners = held or self.library_owner(obj)
        key = self.literal(key_node) if key_node is not None else None
        if name in ("setattr", "delattr"):
            value = node.args[2] if name == "setattr" and len(node.args) > 2 else None
            if not owners and self.dotted(obj) is None:
                self.untyped_writes.append((self.line(node) or 0, key))
            for owner in sorted(owners):
                if key is None or self.replaces(owner, key, value):
                    self.find(f"{'replaces' if name == 'setattr' else 'deletes'} {owner}.{key or '<computed name>'}: "
                              "replacing parts of a library module is not allowed (tampering)", node)
            return
        if not held:    # sys, types, importlib...; another library's module holding torch or camplib
            held = {o for o in owners if o.split(".")[0] in _ESCAPE_HEADS} | {
                c for o in owners if o.split(".")[0] not in self.rules.packages for c in _reexported(self.rules, o)}
        if name in ("vars", "inspect.getmembers"):
            if held:
                self.computed(held, node, f"{_show(node)} reads every attribute of {_names(held)}")
            return
        if key_node is None:
            return
        if key is not None:
            self.attribute_name(key, node)
            if not held and key not in self.own:
                self.hit(self.rules.by_attribute(key), f"{_show(node)} looks up {key!r}", node)
            for owner in held:
                self.check_path(f"{owner}.{key}", node)
            return
        if held:
            self.computed(held, node, f"{_show(node)} looks up an attribute of {_names(held)} by a name computed "
                                      "at run time: it could be any of them. Write the attribute's name literally")
            return
        pattern = ".*" if key_node.__dict__.get("id") == "\0unpacked" else name_pattern(key_node, self.env)
        if pattern is None:
            self.opaque.append((self.line(node) or 0, _show(node)))
            return
        if not re.sub(r"\.\*|\\|[_()|?:]", "", pattern):
            # no letters of its own (`"_" + name`, `f"__{op}__"`): honest dispatch on an object's own
            # attributes, as opaque as a plain variable (a module it could reach is handled above)
            self.opaque.append((self.line(node) or 0, _show(node)))
            return
        past = could_be(pattern, sorted(_REACH_PAST | _BELOW_OBSERVED))
        if past:
            self.find(f"{_show(node)} builds an attribute name at run time that could spell {_names(past)}, "
                      "which reach past the library's own functions or below what the grader observes: "
                      "write the attribute's name literally", node)
        entries = [e for e in self.rules.callables if could_be(pattern, self.rules.candidates(e))]
        self.hit(entries, f"{_show(node)} builds an attribute name at run time that could spell "
                          f"{_names(entries)}. Write the attribute's name literally", node)

    def computed(self, modules, node=None, why: str | None = None) -> None:
        """A lookup in `modules` by a name computed at run time (getattr(m, 'soft' + x),
        vars(m), m.__dict__[...]): it may reach any forbidden entry of those packages."""
        for module in sorted(modules):
            heads = {module.split(".")[0], *_real_heads(module)}      # camplib.activation_checkpoint.torch is torch
            entries = [e for e in self.rules.entries if e.split(".")[0] in heads]
            head = module.split(".")[0]
            if entries:
                self.hit(entries, why, node)
            elif head in _ESCAPE_HEADS:
                self.find(f"looks up attributes of {module} by computed names: the grader cannot check them", node)

    def magic(self, node: ast.Call, method: str) -> None:
        args = [self.literal(a) for a in node.args]
        kind = args[0] if args else None
        if method == "run_line_magic" and kind in _SAFE_LINE_MAGICS:
            return
        if method == "run_line_magic" and kind in _CODE_MAGICS and len(args) > 1 and args[1] is not None:
            self.nested(magic_statement(args[1]), node, magic=True)
            return
        if method == "run_cell_magic" and kind in _CODE_MAGICS and len(args) > 2 and args[2] is not None:
            self.nested(args[2], node, magic=True)
            return
        if method in ("system", "getoutput"):
            what = "a shell command (!)"
        elif method in ("run_line_magic", "run_cell_magic") and kind:
            what = f"the %{kind} magic"
        else:
            what = f"get_ipython().{method}()"
        self.find(f"runs {what}, which executes code the grader cannot check", node)

    def nested(self, code: str, node=None, magic: bool = False) -> None:
        try:
            tree = ast.parse(_ipython_transform(code) if magic else code)
        except (SyntaxError, ValueError):
            self.find("runs a string of code (or a %time/%timeit statement) the grader cannot parse", node)
            return
        outer, env = self.outer_line, self.env
        self.outer_line = self.line(node)
        try:
            self.run(tree)
        finally:
            self.outer_line, self.env = outer, env


def _below_message(what: str) -> str:
    return (f"uses {what}, which calls torch.distributed's collectives below the layer the grader observes "
            "(call torch.distributed's own functions: dist.send, dist.isend, dist.all_reduce...)")


def _always_guarded(owner: str) -> bool:
    """Any write into these changes what the course or Python itself does."""
    return owner.split(".")[0] in ("camplib", "sys", "builtins", "importlib") \
        or owner.startswith(("autograder.grading", "autograder.isolation"))


def _real_heads(path: str) -> set[str]:
    """The top-level package the object at `path` comes from (its module's name), when that is
    another package than the path's own: `camplib.activation_checkpoint.torch` -> {"torch"}."""
    obj = resolve(path) if path.split(".")[0] in ("camplib", "autograder") or path.split(".")[0] in sys.modules else None
    name = getattr(obj, "__name__", None) if inspect.ismodule(obj) else getattr(obj, "__module__", None)
    return {name.split(".")[0]} if isinstance(name, str) and name else set()


def _reexported(rules: Rules, path: str) -> set[str]:
    """Modules carrying forbidden entries that the library module at `path` holds as attributes
    (`transformers.modeling_utils.torch`, `.nn`): a lookup in it by a computed name reaches them."""
    try:
        obj = resolve(path)
    except Exception:  # noqa: BLE001 - a library that fails to import holds nothing we can see
        return set()
    if not inspect.ismodule(obj):
        return set()
    found = set()
    for value in list(vars(obj).values()):
        name = getattr(value, "__name__", None) if inspect.ismodule(value) else None
        if isinstance(name, str) and name.split(".")[0] in rules.packages and rules.carrier(name):
            found.add(name)
    return found


def _is_class(path: str) -> bool:
    """`path` names a class (resolved as _module_or_class does; an unknown path is not one)."""
    head = path.split(".")[0]
    if head in ("camplib", "autograder", "torch", "sys", "builtins", "importlib") or head in sys.modules:
        return inspect.isclass(resolve(path))
    return False


@lru_cache(maxsize=4096)
def _module_or_class(path: str) -> bool:
    """`path` names a module or a class (a write into it changes the library for every caller).
    Resolved only inside the packages a lab may forbid, camplib, autograder and already-imported
    libraries; an unknown path counts as one."""
    head = path.split(".")[0]
    if head in ("camplib", "autograder", "torch", "sys", "builtins", "importlib") or head in sys.modules:
        obj = resolve(path)
        return obj is None or inspect.ismodule(obj) or inspect.isclass(obj)
    return True


def _show(node) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001 - a tree the unparser does not know: say less
        return "a lookup"
    return text if len(text) <= 80 else text[:77] + "..."


def _names(items) -> str:
    items = sorted(items)
    return ", ".join(items[:6]) + (f" (+{len(items) - 6} more)" if len(items) > 6 else "")


def _imported(node, literal=None) -> str | None:
    """The module `__import__('x')` / `importlib.import_module('x')` returns, when its name is
    known from the source (`literal` folds names built from literals)."""
    literal = literal or const_str
    if isinstance(node, ast.Call) and node.args and literal(node.args[0]):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in ("__import__", "import_module"):
            module = literal(node.args[0])
            fromlist = len(node.args) > 3 or any(k.arg == "fromlist" for k in node.keywords)
            return module.split(".")[0] if name == "__import__" and not fromlist else module
    return None


def _is_get_ipython(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "get_ipython"


def _is_magic_call(name_node) -> bool:
    """`get_ipython` as in IPython's own transform: get_ipython().method(...)."""
    call = getattr(name_node, "_camp_parent", None)
    attr = getattr(call, "_camp_parent", None)
    outer = getattr(attr, "_camp_parent", None)
    return _is_get_ipython(call) and isinstance(attr, ast.Attribute) and isinstance(outer, ast.Call) \
        and outer.func is attr


@lru_cache(maxsize=1024)
def _importable_heads(path: str) -> frozenset[str]:
    """{head} when the top-level package of `path` is installed (a library), else empty."""
    head = path.split(".")[0]
    if head in ("getattr", "setattr", "delattr", "hasattr", "vars", "exec", "eval", "compile", "__import__"):
        return frozenset({head})
    return frozenset({head}) if is_module(head) else frozenset()


def _ipython_transform(source: str) -> str:
    """The Python IPython runs for a cell (magics become get_ipython() calls)."""
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(source)


def unparsable_cell(source: str) -> str | None:
    """Why a notebook cell cannot be parsed after IPython's own transforms (None when it can).
    Such a cell is never run by the grader (autograder.grading.engine): IPython might still
    run some of it (automagic), and the scan cannot check what it cannot parse."""
    try:
        ast.parse(_ipython_transform(source))
    except SyntaxError as exc:
        return f"cannot be parsed (SyntaxError: {exc.msg}, line {exc.lineno}): the grader did not run it"
    except ValueError as exc:  # null bytes and the like
        return f"cannot be parsed ({exc}): the grader did not run it"
    return None


def own_attributes(sources: list[str]) -> set[str]:
    """Attribute names the submission defines itself (methods, class attributes, `x.name = ...`,
    setattr with a constant name): `self.softmax` is theirs when they define it."""
    names: set[str] = set()
    for source in sources:
        try:
            tree = ast.parse(_ipython_transform(source))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        names.add(item.name)
                    elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        names |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif (isinstance(node, ast.Call) and callee(node) == "setattr" and len(node.args) > 1
                  and const_str(node.args[1])):
                names.add(const_str(node.args[1]))
    return names


def check(source: str, forbid: list[str], *, cell: bool = True, own: set[str] | None = None,
          local_modules: set[str] = frozenset(), aliases: dict[str, str] | None = None) -> _Scan:
    """The scan of one notebook cell (`cell`: IPython syntax) or one .py file, with everything it
    found (see _Scan). `own`: attribute names the whole submission defines (default: this
    source's own); `aliases`: imports seen in earlier cells, updated with this one's."""
    rules = rules_for(tuple(forbid))
    if own is None:
        own = own_attributes([source])
    checker = _Scan(rules, own, set(local_modules), {} if aliases is None else aliases)
    try:
        text = _ipython_transform(source) if cell else source
        tree = ast.parse(text)
    except SyntaxError as exc:
        checker.find(f"cannot be parsed (SyntaxError: {exc.msg}, line {exc.lineno}): the grader does not run code it cannot check")
        return checker
    except ValueError as exc:  # null bytes and the like
        checker.find(f"cannot be parsed ({exc}): the grader does not run code it cannot check")
        return checker
    checker.run(tree)
    return checker


def scan(source: str, forbid: list[str], **kw) -> tuple[list[str], list[str]]:
    """(forbidden entries used, findings) for one source: `check` without the details."""
    checker = check(source, forbid, **kw)
    return checker.hits, checker.findings


def static_uses(source: str, forbid: list[str], own: set[str] | None = None) -> list[str]:
    """Forbidden entries that `source` (one cell) uses, resolved through imports and aliases,
    in the order of `forbid`."""
    hits, _ = scan(source, forbid, own=own)
    return [e for e in forbid if e in hits]
