"""Argument checks shared across the package (torch-free)."""

from __future__ import annotations

import numpy as np


def positive_int(value, name: str, minimum: int = 1) -> int:
    """``value`` as an int, or a ValueError naming ``name`` unless it is an integer
    (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)
