"""Per-lab forbidden APIs (course/labs.toml `forbid`): the things that would trivialise a lab,
e.g. `torch.nn.functional.scaled_dot_product_attention` in the attention lab.

This is the trusted, static half (the grader runs it on the submission's files before any of
the student's code runs); `observe` is the runtime half inside the student's process, which the
grader validates with canaries but never relies on alone.

A forbidden entry is caught under any name that reaches it:
- the dotted name, through imports, aliases, `getattr` with constant names and `__dict__[...]`;
- another public or private name of the same thing: `torch._C._nn.softmax`, `nn.Softmax`,
  `torch.ops.aten._safe_softmax`, `aten._scaled_dot_product_flash_attention` (`alias_of`);
- a Tensor method spelled like it (`x.softmax(-1)`), unless the student defines that attribute
  themselves (their own `self.softmax` is theirs; the runtime observer still watches the call).
Besides forbidden names, the scan reports what would let code escape it (`findings`): source
it cannot parse after IPython's own transforms (a notebook cell like that is simply not run,
`unparsable_cell`; an importable .py file costs every test), magics and shell escapes that run code it
cannot see, exec/eval of computed strings, lookups by computed names on library modules,
reloading or replacing library modules, reaching past wrappers (`__wrapped__`, `__closure__`,
gc), and touching the machinery that observes calls.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from functools import lru_cache

# -- names ------------------------------------------------------------------------------------

_PREFIX_WORDS = {"safe", "native", "fused", "special", "masked", "sparse", "nested", "math", "cudnn", "efficient"}
_MEANING_CHANGERS = {"log"}          # log_softmax is another function, not softmax by another name


def _words(name: str) -> list[str]:
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z][a-z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name)   # RMSNorm -> RMS_Norm, AdamW stays
    return [w for w in name.lower().split("_") if w]


def alias_of(name: str, entry: str) -> bool:
    """True when identifier `name` is `entry`'s function under another (public or private) name:
    `_softmax`, `_safe_softmax`, `Softmax`, `special_softmax`, `_scaled_dot_product_flash_attention`,
    `_fused_adamw_`, `native_layer_norm`; not `log_softmax` or `softmax_scale`."""
    last = entry.rsplit(".", 1)[-1]
    target, words = _words(last), _words(name)
    if not target or not words or _MEANING_CHANGERS & (set(words) - set(target)):
        return False
    if words == target:
        return True
    private = name.startswith("_")
    while words and words[0] in _PREFIX_WORDS and words[0] not in target:
        words, private = words[1:], True
    if not private:
        return False
    if len(target) == 1:
        return words[:1] == target
    it = iter(words)
    return words[0] == target[0] and all(w in it for w in target)   # in order, extra words between


@lru_cache(maxsize=None)
def _is_module(entry: str) -> bool:
    try:
        return importlib.util.find_spec(entry) is not None
    except (ImportError, ValueError):
        return False


@lru_cache(maxsize=4096)
def _resolve(dotted: str):
    """The object named by `dotted`: the longest importable module prefix, then attributes
    (None when it does not exist). Only called for names under a forbidden entry's package."""
    parts = dotted.split(".")
    if "__main__" in parts:
        return None
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except Exception:
            continue
        for name in parts[i:]:
            try:
                obj = getattr(obj, name)
            except Exception:
                return None
        return obj
    return None


class Rules:
    """A lab's forbidden entries, with what the scan needs to know about each."""

    def __init__(self, forbid: list[str]):
        self.entries = list(forbid)
        self.modules = [e for e in forbid if _is_module(e)]
        self.callables = [e for e in forbid if e not in self.modules]
        self.packages = {e.split(".")[0] for e in forbid} | {"camplib", "autograder"}
        self.objects = {}
        for e in self.callables:
            obj = _resolve(e)
            if obj is not None:
                self.objects.setdefault(id(obj), []).append(e)

    def by_path(self, path: str) -> list[str]:
        """Entries that the library name `path` reaches (itself, inside a module entry, the same
        object under another path, or an alias of a forbidden function in the same package)."""
        hits = [e for e in self.entries if path == e or path.startswith(e + ".")]
        head = path.split(".")[0]
        parts = path.split(".")[1:]
        for e in self.callables:
            if e not in hits and e.split(".")[0] == head and any(alias_of(p, e) for p in parts):
                hits.append(e)
        if head in self.packages and not hits:
            obj = _resolve(path)
            if obj is not None:
                hits += self.objects.get(id(obj), [])
                module = getattr(obj, "__module__", None) or ""
                hits += [e for e in self.modules if isinstance(module, str)
                         and (module == e or module.startswith(e + ".")) and e not in hits]
        return hits

    def by_attribute(self, attr: str) -> list[str]:
        """Entries an attribute of an object the scanner cannot type (`x.softmax`) may reach."""
        return [e for e in self.callables if alias_of(attr, e)]


# -- what counts as tampering --------------------------------------------------------------------

_REACH_PAST = {"__wrapped__", "__closure__", "__globals__", "__code__", "__builtins__", "__subclasses__",
               "cell_contents", "f_back", "f_globals", "f_locals", "gi_frame", "tb_frame", "__kwdefaults__",
               "__defaults__", "func_globals", "__getattribute__"}
_MACHINERY = re.compile(r"(torch_dispatch|_dispatch_|dispatch_mode|python_dispatch|DispatchKey|TorchDispatch|"
                        r"torch_function|TorchFunction|DisableTorch|setprofile|settrace|_getframe|currentframe|"
                        r"_current_frames|getclosurevars|^unwrap$|^_?push_mode$|^_?pop_mode$|_disable_current_modes|"
                        r"^(Observer|_OpObserver|Tripwires|called_by_student|canary\w*|_canary\w*|Runner|observer|"
                        r"tripwires|student_process|sandbox_init)$)")
_OPAQUE_CALLS = {"exec", "eval", "compile", "__import__", "importlib.import_module", "importlib.__import__",
                 "builtins.exec", "builtins.eval", "builtins.compile"}
_LOADERS = {"importlib.reload", "imp.reload", "importlib.machinery", "importlib.util.spec_from_file_location",
            "importlib.util.module_from_spec", "importlib.util.spec_from_loader", "zipimport", "runpy", "imp",
            "marshal", "types.CodeType", "types.FunctionType", "types.ModuleType", "pickle.loads", "pickle.load",
            "pickle.Unpickler", "_pickle", "dill", "cloudpickle", "sys.modules", "sys.path", "sys.meta_path",
            "sys.path_hooks", "sys.setprofile", "sys.settrace", "threading.setprofile", "threading.settrace",
            "gc.get_objects", "gc.get_referents", "gc.get_referrers", "builtins", "ctypes.pythonapi"}
_DYNAMIC_LOOKUPS = {"getattr", "setattr", "delattr", "hasattr", "vars", "operator.attrgetter",
                    "operator.methodcaller", "inspect.getmembers", "inspect.getattr_static"}
_SAFE_LINE_MAGICS = {"matplotlib", "pinfo", "pinfo2", "psearch", "precision", "pprint", "xmode", "who", "whos"}
_CODE_MAGICS = {"time", "timeit", "capture"}   # their argument or body is Python: scanned like a cell


class _Scan:
    """One pass over one source (a cell or a file), collecting forbidden entries and findings.
    `aliases` (local name -> library path) carries imports from one cell to the next."""

    def __init__(self, rules: Rules, own: set[str], local_modules: set[str], aliases: dict[str, str]):
        self.rules, self.own, self.local, self.aliases = rules, own, local_modules, aliases
        self.hits: list[str] = []
        self.findings: list[str] = []

    def hit(self, entries):
        self.hits += [e for e in entries if e not in self.hits]

    def find(self, message: str):
        if message not in self.findings:
            self.findings.append(message)

    # names ---------------------------------------------------------------------------------------
    def dotted(self, node) -> str | None:
        """`a.b.c`, `getattr(a.b, 'c')` and `a.__dict__['c']` as "module.b.c" with imports resolved."""
        parts = []
        while True:
            if isinstance(node, ast.Attribute) and node.attr != "__dict__":
                parts.append(node.attr)
                node = node.value
            elif (isinstance(node, ast.Call) and _callee(node) == "getattr" and len(node.args) >= 2
                  and _const_str(node.args[1]) is not None):
                parts.append(_const_str(node.args[1]))
                node = node.args[0]
            elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                  and node.value.attr == "__dict__" and _const_str(node.slice) is not None):
                parts.append(_const_str(node.slice))
                node = node.value.value
            else:
                break
        if not isinstance(node, ast.Name):
            return None
        head = self.aliases.get(node.id)
        if head is None:
            return None
        return ".".join([head] + parts[::-1])

    def library(self, path: str | None) -> bool:
        return bool(path) and path.split(".")[0] not in self.local and path.split(".")[0] in _importable_heads(path)

    # the pass ------------------------------------------------------------------------------------
    def run(self, tree: ast.AST) -> None:
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                child._camp_parent = node
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    self.check_path(a.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:       # a relative import inside the submission's own package
                    continue
                module = node.module or ""
                for a in node.names:
                    if a.name == "*":
                        self.hit(e for e in self.rules.entries if e.rpartition(".")[0] == module
                                 or e.startswith(module + "."))
                        continue
                    self.aliases[a.asname or a.name] = f"{module}.{a.name}"
                    self.check_path(f"{module}.{a.name}")
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                path = self.dotted(node.value) or _imported(node.value)   # `aten = torch.ops.aten`
                if path and self.library(path):
                    self.aliases[node.targets[0].id] = path
        for node in ast.walk(tree):
            self.visit(node)

    def check_path(self, path: str) -> None:
        if not self.library(path):
            return
        self.hit(self.rules.by_path(path))
        parts = path.split(".")
        if any(".".join(parts[:i]) in _LOADERS for i in range(1, len(parts) + 1)):
            self.find(f"uses {path}, which loads or replaces code the grader cannot check")
        if any(_MACHINERY.search(p) for p in parts) or (parts[0] == "autograder" and len(parts) > 1
                                                        and parts[1] not in ("checks", "text")):
            self.find(f"uses {path}, part of the machinery that observes calls during grading")

    def visit(self, node) -> None:
        if isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            path = self.dotted(node)
            if path and self.library(path):
                self.check_path(path)
            elif path and path.split(".")[0] in self.local:
                pass   # an attribute of the submission's own module: scanned in its own file
            elif isinstance(node, ast.Attribute) and node.attr not in self.own:
                self.hit(self.rules.by_attribute(node.attr))
        if isinstance(node, ast.Attribute):
            if node.attr in _REACH_PAST:
                self.find(f"reads {node.attr}, which reaches past the library's own functions")
            elif _MACHINERY.search(node.attr):
                self.find(f"uses .{node.attr}, part of the machinery that observes calls during grading")
            if node.attr == "__dict__":
                target = self.dotted(node.value)
                if self.library(target):
                    self.computed(target)
        if isinstance(node, ast.Name):
            if node.id in _REACH_PAST:
                self.find(f"uses {node.id}, which reaches past the library's own functions")
            elif node.id == "get_ipython" and not _is_magic_call(node):
                self.find("uses get_ipython(), which can run code the grader cannot check")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for t in targets:
                self.check_write(t)
        if isinstance(node, ast.Call):
            self.check_call(node)

    def check_write(self, target) -> None:
        for t in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
            if isinstance(t, ast.Attribute):
                owner, attr = self.dotted(t.value), t.attr
            elif isinstance(t, ast.Subscript):
                owner, attr = self.dotted(t.value), None
                if owner is None and isinstance(t.value, ast.Attribute) and t.value.attr == "__dict__":
                    owner = self.dotted(t.value.value)
            else:
                continue
            if self.library(owner) and self.replaces(owner, attr):
                self.find(f"assigns to {owner}{'.' + attr if attr else '[...]'}: "
                          "replacing parts of a library module is not allowed in this lab")

    def replaces(self, owner: str, attr: str | None) -> bool:
        """A write to `owner.attr` that could change what a forbidden name or the observer is."""
        if owner.split(".")[0] in ("camplib", "sys", "builtins", "importlib") \
                or owner.startswith(("autograder.grading", "autograder.isolation")):
            return True
        if attr is None:
            return True
        path = f"{owner}.{attr}"
        return bool(self.rules.by_path(path) or self.rules.by_attribute(attr) or _MACHINERY.search(attr)
                    or any(e.startswith(path + ".") for e in self.rules.entries))

    def check_call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute) and _is_get_ipython(node.func.value):
            self.magic(node, node.func.attr)
            return
        name = self.dotted(node.func) or _callee(node)
        if name in _OPAQUE_CALLS:
            code = _const_str(node.args[0]) if node.args else None
            if name in ("exec", "eval", "compile") and code is not None:
                self.nested(code)
            elif name in ("__import__", "importlib.import_module") and code is not None:
                self.check_path(code)
            else:
                self.find(f"calls {name}() on a computed value: the grader cannot see what it runs")
        elif name in ("operator.attrgetter", "operator.methodcaller") and node.args:
            key = _const_str(node.args[0])
            if key is None:
                self.find(f"calls {name}() with a computed name: the grader cannot check it")
            else:
                self.hit(e for part in key.split(".") for e in self.rules.by_attribute(part) if part not in self.own)
        elif name in _DYNAMIC_LOOKUPS and node.args:
            obj = self.dotted(node.args[0])
            key = _const_str(node.args[1]) if len(node.args) > 1 else None
            if self.library(obj):
                if name in ("vars", "inspect.getmembers") or (key is None and len(node.args) > 1):
                    self.computed(obj)
                elif key is not None and name in ("setattr", "delattr") and self.replaces(obj, key):
                    self.find(f"replaces {obj}.{key}: replacing parts of a library module is not allowed in this lab")
            elif key is not None and key not in self.own:
                self.hit(self.rules.by_attribute(key))

    def computed(self, module: str) -> None:
        """A lookup in `module` by a name computed at run time (getattr(m, 'soft' + 'max'),
        vars(m), m.__dict__[...]): it may reach any forbidden entry of that package."""
        head = module.split(".")[0]
        entries = [e for e in self.rules.entries if e.split(".")[0] == head]
        if entries:
            self.hit(entries)
        elif head == "autograder" or head in ("sys", "builtins", "importlib", "gc"):
            self.find(f"looks up attributes of {module} by computed names: the grader cannot check them")

    def magic(self, node: ast.Call, method: str) -> None:
        args = [_const_str(a) for a in node.args]
        kind = args[0] if args else None
        if method == "run_line_magic" and kind in _SAFE_LINE_MAGICS:
            return
        if method == "run_line_magic" and kind in _CODE_MAGICS and len(args) > 1 and args[1] is not None:
            self.nested(args[1], magic=True)
            return
        if method == "run_cell_magic" and kind in _CODE_MAGICS and len(args) > 2 and args[2] is not None:
            self.nested(args[2], magic=True)
            return
        if method in ("system", "getoutput"):
            what = "a shell command (!)"
        elif method in ("run_line_magic", "run_cell_magic") and kind:
            what = f"the %{kind} magic"
        else:
            what = f"get_ipython().{method}()"
        self.find(f"runs {what}, which executes code the grader cannot check")

    def nested(self, code: str, magic: bool = False) -> None:
        try:
            tree = ast.parse(_ipython_transform(code) if magic else code)
        except (SyntaxError, ValueError):
            self.find("runs a string of code (or a %time/%timeit statement) the grader cannot parse")
            return
        self.run(tree)


def _imported(node) -> str | None:
    """The module `__import__('x')` / `importlib.import_module('x')` returns, when constant."""
    if isinstance(node, ast.Call) and node.args and _const_str(node.args[0]):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name in ("__import__", "import_module"):
            module = _const_str(node.args[0])
            return module.split(".")[0] if name == "__import__" else module
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
    return frozenset({head}) if _is_module(head) else frozenset()


def _callee(node: ast.Call) -> str | None:
    return node.func.id if isinstance(node.func, ast.Name) else None


def _const_str(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


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
            elif (isinstance(node, ast.Call) and _callee(node) == "setattr" and len(node.args) > 1
                  and _const_str(node.args[1])):
                names.add(_const_str(node.args[1]))
    return names


def scan(source: str, forbid: list[str], *, cell: bool = True, own: set[str] | None = None,
         local_modules: set[str] = frozenset(), aliases: dict[str, str] | None = None
         ) -> tuple[list[str], list[str]]:
    """(forbidden entries used, findings) for one notebook cell (`cell`: IPython syntax) or one
    .py file. `own`: attribute names the whole submission defines (default: this source's own);
    `aliases`: imports seen in earlier cells, updated with this one's."""
    rules = _rules(tuple(forbid))
    if own is None:
        own = own_attributes([source])
    checker = _Scan(rules, own, set(local_modules), {} if aliases is None else aliases)
    try:
        text = _ipython_transform(source) if cell else source
        tree = ast.parse(text)
    except SyntaxError as exc:
        return [], [f"cannot be parsed (SyntaxError: {exc.msg}, line {exc.lineno}): the grader does not run code it cannot check"]
    except ValueError as exc:  # null bytes and the like
        return [], [f"cannot be parsed ({exc}): the grader does not run code it cannot check"]
    checker.run(tree)
    return checker.hits, checker.findings


@lru_cache(maxsize=32)
def _rules(forbid: tuple[str, ...]) -> Rules:
    return Rules(list(forbid))


def static_uses(source: str, forbid: list[str], own: set[str] | None = None) -> list[str]:
    """Forbidden entries that `source` (one cell) uses, resolved through imports and aliases,
    in the order of `forbid`."""
    hits, _ = scan(source, forbid, own=own)
    return [e for e in forbid if e in hits]


class Tripwires:
    """Wrap forbidden callables in this process so that every call is reported: to `report`
    (the observer's channel, autograder.grading.observe) or, without one, into `hits`. Whoever
    calls them, camplib's own internals included, in the student's process it is their call."""

    def __init__(self, forbid: list[str], report=None):
        self.hits: set[str] = set()
        self.report = report or self.hits.update
        self.originals: dict[str, object] = {}
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
            original = getattr(owner, attr)
            self.originals[entry] = original
            setattr(owner, attr, self._wrap(original, entry))

    def _wrap(self, obj, entry: str):
        report, message = self.report, (entry,)
        if inspect.isclass(obj):
            original_init = obj.__init__

            def __init__(self_, *args, **kwargs):
                report(message)
                original_init(self_, *args, **kwargs)
            try:
                return type(obj.__name__, (obj,), {"__init__": __init__, "__module__": obj.__module__,
                                                   "__qualname__": obj.__qualname__})
            except (TypeError, AttributeError):  # final classes, enums with members: leave as is
                return obj

        def wrapper(*args, **kwargs):
            report(message)
            return obj(*args, **kwargs)
        wrapper.__name__ = getattr(obj, "__name__", "wrapped")
        return wrapper
