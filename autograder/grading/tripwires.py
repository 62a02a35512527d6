"""Tripwires: the forbidden Python names of libraries, wrapped in the student's process so that
every call reports (the runtime observer's first layer, autograder.grading.observe)."""
from __future__ import annotations

import importlib
import inspect

from .entries import resolve


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
        owner = resolve(owner_name)  # a module (torch.nn.functional) or a class (torch.Tensor)
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
