"""Progress bars for long steps (extraction, scoring grids, generation, training).

One helper, :func:`progress`, wraps `tqdm <https://tqdm.github.io>`_ so that every
long loop in the package reports the same way::

    from distrank._progress import progress

    for batch in progress(batches, total=len(batches), desc="extract ref", unit="batch"):
        ...

    with progress(total=n_images, desc="extract ref", unit="img") as bar:
        for rows, images in stream:
            ...
            bar.update(len(rows))

Where the bar goes, and how it looks:

- on a terminal (stderr is a tty): tqdm's live bar with the rate and the time left,
  redrawn at most every 0.1 s;
- anywhere else (a pipeline job's log file, a pipe, CI): whole lines, one when the
  step starts, then at most one every :data:`LINE_INTERVAL_S` seconds, and one when
  it ends, each with the count, elapsed time, time left and rate. No carriage
  returns, so a log reads line by line;
- nowhere when quiet: :func:`set_quiet` (the CLI's ``--quiet``) or the environment
  variable ``DISTRANK_QUIET=1``. The loop then runs as if the bar were not there.

The object returned is a ``tqdm`` instance in every case (iterate it, call
``update(n)``, ``set_postfix(...)``, use it as a context manager).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from tqdm import tqdm

__all__ = ["LINE_INTERVAL_S", "is_quiet", "progress", "set_quiet"]

#: Seconds between two progress lines when stderr is not a terminal.
LINE_INTERVAL_S = 30.0
ENV_QUIET = "DISTRANK_QUIET"

_quiet: bool | None = None  # None: follow $DISTRANK_QUIET


def set_quiet(quiet: bool | None = True) -> bool | None:
    """Silence (True) or show (False) every progress bar of this process; None goes back
    to following ``$DISTRANK_QUIET``. Returns the previous setting, to restore it."""
    global _quiet
    previous, _quiet = _quiet, None if quiet is None else bool(quiet)
    return previous


def is_quiet() -> bool:
    """Whether bars are off: :func:`set_quiet`, else ``$DISTRANK_QUIET`` (1/true/yes/on)."""
    if _quiet is not None:
        return _quiet
    return os.environ.get(ENV_QUIET, "").strip().lower() in ("1", "true", "yes", "on")


def progress(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str | None = None,
    unit: str = "it",
    file=None,
) -> tqdm:
    """A progress bar over ``iterable`` (or one to ``update`` by hand up to ``total``).

    iterable : what to loop over; its ``len`` is the total when it has one.
    total : the number of units (items, images, steps) when ``iterable`` has no len
        or is None.
    desc : what the step is, shown first ("extract ref", "train cgan").
    unit : the unit counted ("img", "step"); rates read "12.3img/s".
    file : the stream (default: ``sys.stderr`` at the time of the call, so a job
        that redirects stderr to its log gets the lines there).

    See the module docstring for how it renders on a terminal, in a log, and quiet.
    """
    stream = sys.stderr if file is None else file
    common = {"total": total, "desc": desc, "unit": unit, "file": stream}
    if is_quiet():
        return tqdm(iterable, disable=True, **common)
    if _isatty(stream):
        return tqdm(iterable, dynamic_ncols=True, **common)
    return _Lines(
        iterable,
        mininterval=LINE_INTERVAL_S,
        maxinterval=LINE_INTERVAL_S,
        ascii=True,
        ncols=80,
        **common,
    )


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


class _Lines(tqdm):
    """tqdm printing whole lines: at the start, every ``mininterval`` s, and at the end."""

    monitor_interval = 0  # no monitor thread: a line only when the loop advances

    def display(self, msg=None, pos=None):
        if msg == "":  # tqdm clearing its line: nothing to clear in a log
            return False
        self.fp.write(f"{self if msg is None else msg}\n")
        self.fp.flush()
        return True

    def close(self):
        if not self.disable and self.last_print_n != self.n:
            self.refresh()  # the final count, if the last line did not show it
        self.leave = False  # tqdm's own final redraw would repeat that line
        super().close()
