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


def draw_subset(labels, n_images: int, spec, *, seed: int, where: str) -> np.ndarray:
    """Sorted rows of a seeded subset: ``spec["per_class"]`` images of each class, or
    ``spec["n"]`` at random (``numpy.random.default_rng(seed)``, no replacement).

    ``labels`` (None for an unlabelled source) and ``n_images`` describe the source;
    ``where`` names the config section in errors (``reference``, ``heldout``).
    """
    if "per_class" in spec:
        if labels is None:
            raise ValueError(
                f"{where}.per_class needs class labels, but {where}.source has "
                "none; draw n images instead"
            )
        return per_class_subset(labels, spec["per_class"], seed=seed)
    if spec["n"] > n_images:
        raise ValueError(f"{where}.n is {spec['n']}, but {where}.source has only {n_images} images")
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n_images, spec["n"], replace=False))
