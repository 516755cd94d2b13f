"""Seeded, class-balanced subsets of labelled image sets."""

from __future__ import annotations

import numpy as np


def per_class_subset(labels, per_class: int, *, seed: int) -> np.ndarray:
    """Sorted row indices of `per_class` rows drawn without replacement from each class.

    Raises ValueError naming the class when it has fewer rows than asked for.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    picked = []
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        if len(rows) < per_class:
            raise ValueError(f"class {c} has {len(rows)} rows, fewer than per_class={per_class}")
        picked.append(rng.choice(rows, per_class, replace=False))
    return np.sort(np.concatenate(picked))
