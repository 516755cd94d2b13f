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


def save_real_subset(out, spec, *, paths=None, seed: int, where: str, workers: int = 1) -> None:
    """The reference pool or the held-out real images: the seeded subset of
    ``spec["source"]`` that ``spec`` asks for (:func:`draw_subset`), saved with its
    labels, source and rows (``data.images.save_images``)."""
    from distrank.data.images import save_images
    from distrank.data.sources import load_source

    image_set = load_source(spec["source"], paths=paths, workers=workers)
    images, labels = image_set
    rows = draw_subset(labels, len(images), spec, seed=seed, where=where)
    names = image_set.label_names
    save_images(
        out,
        images[rows],
        None if labels is None else labels[rows],
        source=dict(spec["source"]),
        rows=rows.tolist(),
        label_names=None if names is None else list(names),
    )
