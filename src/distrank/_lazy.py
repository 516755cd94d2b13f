"""Lazy package attributes (PEP 562): a package names what its submodules export and
imports a submodule on the first use of one of its names, so that importing the
package stays cheap (no torch, scipy or scikit-learn)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: name -> submodule that defines it."""

    def __getattr__(name: str):
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
