"""camplib's table of contents: every submodule is listed in `camplib.__all__` (and so reachable
lazily as `camplib.<name>`) and named in the package docstring, so a reader finds each piece."""
import pkgutil

import camplib


def test_every_submodule_is_listed_and_described():
    modules = sorted(m.name for m in pkgutil.iter_modules(camplib.__path__))
    assert sorted(camplib.__all__) == modules, (set(modules) ^ set(camplib.__all__))
    undescribed = [m for m in modules if f"`{m}`" not in camplib.__doc__]
    assert not undescribed, f"camplib's docstring does not name {undescribed}"
