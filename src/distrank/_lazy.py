"""Lazy package attributes (PEP 562): a package names what its submodules export and
imports a submodule on the first use of one of its names, so that importing the
package stays cheap (no torch, scipy or scikit-learn)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence


def lazy_names(exports: Mapping[str, Sequence[str]]) -> list[str]:
    """Every name of ``exports`` (submodule -> the names it defines), in order."""
    return [name for names in exports.values() for name in names]


def lazy_getattr(package: str, exports: Mapping[str, Sequence[str]]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``, given each submodule's names; the
    package's ``dir()`` then lists those names too (as autodoc and completion expect)."""
    where = {name: module for module, names in exports.items() for name in names}
    namespace = sys.modules[package].__dict__
    namespace["__dir__"] = lambda: sorted({*namespace, *where})

    def __getattr__(name: str):
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
