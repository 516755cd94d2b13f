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


#: The columns of a job's cost file: those of a Snakemake benchmark file that it fills.
COST_COLUMNS = ("s", "h:m:s", "max_rss", "cpu_time")


def process_cost() -> dict[str, float]:
    """This process's cost so far, from the operating system's own accounting: ``s``, the
    wall seconds since it started; ``cpu_time``, the user + system seconds of it and of
    the children it waited for; ``max_rss``, the peak resident memory (MB) of it or of
    its largest such child."""
    import resource

    times = os.times()
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes there, KB here
    who = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    return {
        "s": _age(),
        "cpu_time": times.user + times.system + times.children_user + times.children_system,
        "max_rss": max(resource.getrusage(w).ru_maxrss for w in who) * scale / 2**20,
    }


def _age() -> float:
    """Seconds since this process started: to 10 ms from /proc (its start and the uptime,
    both counted from boot), else psutil (Snakemake's dependency)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
            return float(uptime.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except OSError:
        import time

        import psutil

        return time.time() - psutil.Process().create_time()


def write_cost(path: str | os.PathLike) -> None:
    """Write :func:`process_cost` to ``path`` as a one-row benchmark file (tab-separated,
    Snakemake's column names): a pipeline job's cost, exact where Snakemake's
    ``benchmark:`` directive samples it (``workflow/rules/cost.smk`` says why the
    pipeline does not use that)."""
    cost = process_cost()
    minutes, seconds = divmod(int(cost["s"]), 60)
    row = [f"{cost['s']:.4f}", f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"]
    row += [f"{cost['max_rss']:.2f}", f"{cost['cpu_time']:.2f}"]
    with atomic_open(path, "w") as handle:
        handle.write("\t".join(COST_COLUMNS) + "\n" + "\t".join(row) + "\n")


@contextlib.contextmanager
def logged(log_path: str | os.PathLike | None, cost: str | os.PathLike | None = None):
    """Send a pipeline job's stdout, stderr and logging records to its log file and, where
    ``cost`` names a file, write the job's cost there once it succeeds
    (:func:`write_cost`; a failed job leaves none)."""
    if cost is not None:
        Path(cost).unlink(missing_ok=True)
    with _to_log(log_path):
        yield
    if cost is not None:
        write_cost(cost)


@contextlib.contextmanager
def _to_log(log_path: str | os.PathLike | None):
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
