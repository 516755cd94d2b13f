"""Small file helpers shared by every stage: atomic writes and job logs.

Every output is written atomically (a temporary file in the target folder, then
:func:`os.replace`), so an interrupted job never leaves a half-written output that
a later run would mistake for a finished one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

_UMASK = os.umask(0)
os.umask(_UMASK)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; rename it onto `path` only on success.

    A failure leaves neither a partial file nor the temporary one behind, so an
    interrupted job never leaves an output that looks finished. The temporary name
    keeps the suffix (np.savez appends ".npz" to names without it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it owner-only
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", **kwargs):
    """An open file whose contents replace `path` (flushed to disk) only on success."""
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, creating parent folders."""
    with atomic_open(path) as handle:
        handle.write(data)
    return Path(path)


def output_path(stem: str | os.PathLike[str], suffix: str) -> Path:
    """``stem`` plus ``suffix`` (``"results/x/E1_gap"`` + ``".csv"``).

    Appends rather than calling :meth:`Path.with_suffix`, which would cut a stem
    that itself contains a dot.
    """
    return Path(f"{os.fspath(stem)}{suffix}")


def user_cache_dir(*parts: str) -> Path:
    """The user's distrank cache folder, ``parts`` joined below it: ``$XDG_CACHE_HOME/distrank``,
    else ``~/.cache/distrank`` (the feature cache and the network weights live here, never in
    the current folder)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base, "distrank", *parts)


def file_digest(path: str | os.PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes (``sha256`` unless told), read in chunks."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, algorithm).hexdigest()


def text_digest(text: str, algorithm: str = "sha256") -> str:
    """Hex digest of ``text`` encoded as UTF-8."""
    return hashlib.new(algorithm, text.encode()).hexdigest()


def parts_digest(parts, algorithm: str = "sha256") -> str:
    """Hex digest of byte strings fed in order (e.g. the digests of files, in order)."""
    h = hashlib.new(algorithm)
    for part in parts:
        h.update(part)
    return h.hexdigest()


def array_digest(*arrays) -> str:
    """sha256 over numpy arrays' dtypes, shapes and bytes, in order."""
    import numpy as np

    parts = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        parts += [f"{a.dtype.str}{a.shape}".encode(), a.tobytes()]
    return parts_digest(parts)


def write_json(path: str | os.PathLike, obj) -> None:
    """Write `obj` as sorted, indented JSON, atomically."""
    with atomic_open(path, "w") as handle:
        handle.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | os.PathLike):
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


@contextlib.contextmanager
def logged(log_path: str | os.PathLike | None):
    """Send a pipeline job's stdout, stderr and logging records to its log file."""
    if log_path is None:
        yield
        return
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with (
        open(log_path, "w") as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),
    ):
        handler = logging.StreamHandler(log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            yield
        except BaseException:
            import traceback

            traceback.print_exc(file=log)
            raise
        finally:
            root.removeHandler(handler)
            sys.stdout.flush()
