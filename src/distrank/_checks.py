"""Argument checks shared across the package (torch-free)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

#: The epsilons a Gaussian release may have (``metrics._privacy``: below, the noise swamps
#: any KD; above, it is below float32 resolution; the calibration is checked across it).
EPSILON_RANGE = (1e-3, 1e9)


def positive_int(value, name: str, minimum: int = 1) -> int:
    """``value`` as an int, or a ValueError naming ``name`` unless it is an integer
    (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


class InputError(ValueError):
    """Bad input, worded for the user. ``path`` is the file it is about (the message
    starts with it), ``key`` the array or field of that file, ``subject`` the input
    of a library call it is about: ``("reference", None)``, ``("client", name)`` or
    ``("model", name)``, so that a caller who read that input from a file can name
    the file (:meth:`at`)."""

    def __init__(self, reason: str, *, path=None, key: str | None = None, subject=None):
        self.reason, self.path, self.key, self.subject = reason, path, key, subject
        super().__init__(reason if path is None else f"{path}: {reason}")

    def at(self, path) -> InputError:
        """This error, about the file ``path`` (itself when ``path`` is None or it
        already names a file)."""
        if path is None or self.path is not None:
            return self
        return type(self)(self.reason, path=path, key=self.key, subject=self.subject)


class TooFewRows(InputError):
    """A sample with fewer rows than a metric or estimator needs (a site in secure mode
    says only that much)."""


@contextmanager
def about(kind: str, name: str | None = None) -> Iterator[None]:
    """Checks of one input of a library call: a ``ValueError`` raised inside becomes an
    :class:`InputError` with ``subject`` ``(kind, name)`` (the message unchanged); an
    :class:`InputError` (or subclass) without a subject gets that subject."""
    try:
        yield
    except InputError as err:
        if err.subject is None:
            err.subject = (kind, name)
        raise
    except ValueError as err:
        raise InputError(str(err), subject=(kind, name)) from None
