"""threadpoolctl's controller of the BLAS and OpenMP libraries loaded in this process, for
sections that hold them to a thread count (``blas_libraries().limit(...)``).

A new controller searches the process's libraries (4.5 ms): E4's FD step enters such a
section 1,400 times (6.3 of its 78 s). So one is made per state: numpy's and torch's
libraries load with the modules that call this, scipy's own BLAS (the banded factors'
QR) when ``scipy.linalg`` is imported, which makes a second.
"""

from __future__ import annotations

import functools
import sys

__all__ = ["blas_libraries"]


def blas_libraries():
    """The controller of the libraries loaded now (a ``threadpoolctl.ThreadpoolController``)."""
    return _controller("scipy.linalg" in sys.modules)


@functools.cache
def _controller(scipy_loaded: bool):
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()
