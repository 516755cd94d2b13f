"""Report: result tables (CSV, Markdown, LaTeX) and figures (PDF, PNG).

Every file is written atomically (a temporary file in the target folder, then
:func:`os.replace`), so an interrupted job never leaves a half-written output that
a later run would mistake for a finished one, and the same input gives the same
bytes, so two runs of the pipeline can be compared with ``cmp``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "output_path"]


def output_path(stem: str | os.PathLike[str], suffix: str) -> Path:
    """``stem`` plus ``suffix`` (``"results/x/E1_gap"`` + ``".csv"``).

    Appends rather than calling :meth:`Path.with_suffix`, which would cut a stem
    that itself contains a dot.
    """
    return Path(f"{os.fspath(stem)}{suffix}")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, creating parent folders."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        # mkstemp creates the file owner-only; outputs are ordinary readable files.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
