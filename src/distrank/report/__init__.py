"""Report: result tables (CSV, Markdown, LaTeX) and figures (PDF, PNG).

Every file is written atomically (a temporary file in the target folder, then
:func:`os.replace`), so an interrupted job never leaves a half-written output that
a later run would mistake for a finished one, and the same input gives the same
bytes, so two runs of the pipeline can be compared with ``cmp``.
"""

from __future__ import annotations

import os
from pathlib import Path

from distrank._io import atomic_open

__all__ = ["atomic_write_bytes", "output_path"]


def output_path(stem: str | os.PathLike[str], suffix: str) -> Path:
    """``stem`` plus ``suffix`` (``"results/x/E1_gap"`` + ``".csv"``).

    Appends rather than calling :meth:`Path.with_suffix`, which would cut a stem
    that itself contains a dot.
    """
    return Path(f"{os.fspath(stem)}{suffix}")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, creating parent folders."""
    with atomic_open(path) as handle:
        handle.write(data)
    return Path(path)
