"""A lab's forbidden entries as names: which identifiers are another name of an entry
(`alias_of`), what a dotted name resolves to (`resolve`), and `Rules`, what both halves of the
check need to know about each entry: the static scan (forbid) and the runtime observer (observe,
tripwires) import this, never each other.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from functools import lru_cache

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
    if not private or not words:          # `cudnn`, `sparse`: a prefix word alone names nothing
        return False
    if len(target) == 1:
        return words[:1] == target
    it = iter(words)
    return words[0] == target[0] and all(w in it for w in target)   # in order, extra words between


@lru_cache(maxsize=None)
def is_module(entry: str) -> bool:
    try:
        return importlib.util.find_spec(entry) is not None
    except (ImportError, ValueError):
        return False


@lru_cache(maxsize=4096)
def resolve(dotted: str):
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
        self.modules = [e for e in forbid if is_module(e)]
        self.callables = [e for e in forbid if e not in self.modules]
        self.packages = {e.split(".")[0] for e in forbid} | {"camplib", "autograder"}
        self.objects = {}
        for e in self.callables:
            obj = resolve(e)
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
        suspicious = parts and any(alias_of(parts[-1], e) for e in self.callables)   # peft.x.nn.functional.softmax
        if (head in self.packages or suspicious) and not hits:
            obj = resolve(path)
            if obj is not None:
                hits += self.objects.get(id(obj), [])
                module = getattr(obj, "__module__", None) or ""
                hits += [e for e in self.modules if isinstance(module, str)
                         and (module == e or module.startswith(e + ".")) and e not in hits]
        return hits

    def carrier(self, path: str) -> bool:
        """`path` is a module or class of a package the lab forbids something in (or of the
        course's own packages) that holds a forbidden entry: a lookup in it by a name computed at
        run time could reach one, and it is worth watching where it goes."""
        return _carrier(self, path)

    def candidates(self, entry: str) -> list[str]:
        """Spellings of `entry`'s name that `alias_of` accepts, to match a partly computed name
        against: `softmax`, `_softmax`, `Softmax`, `_safe_softmax`, `softmax_`..."""
        return _candidates(entry.rsplit(".", 1)[-1])

    def by_attribute(self, attr: str) -> list[str]:
        """Entries an attribute of an object the scanner cannot type (`x.softmax`) may reach."""
        return [e for e in self.callables if alias_of(attr, e)]


@lru_cache(maxsize=4096)
def _candidates(last: str) -> list[str]:
    words = _words(last)
    plain, camel = "_".join(words), "".join(w.capitalize() for w in words)
    out = {last, plain, camel, "_" + plain, "_" + plain + "_", plain + "_", "_" + camel}
    out |= {f"_{p}_{plain}" for p in _PREFIX_WORDS} | {f"{p}_{plain}" for p in _PREFIX_WORDS}
    return sorted(out)


_CARRIERS: dict = {}


def _carrier(rules: Rules, path: str) -> bool:
    key = (tuple(rules.entries), path)
    if key not in _CARRIERS:
        _CARRIERS[key] = _is_carrier(rules, path)
    return _CARRIERS[key]


def _is_carrier(rules: Rules, path: str) -> bool:
    if path.split(".")[0] not in rules.packages:
        return False
    if any(e.startswith(path + ".") for e in rules.entries):
        return True
    obj = resolve(path)
    if inspect.ismodule(obj):
        return True
    if inspect.isclass(obj):
        try:
            return any(rules.by_attribute(a) for a in dir(obj))
        except Exception:  # noqa: BLE001 - a class whose dir() fails: treat it as one
            return True
    return False


@lru_cache(maxsize=32)
def rules_for(forbid: tuple[str, ...]) -> Rules:
    return Rules(list(forbid))
