"""Controlled degradations of held-out real images, each a family with a known order.

Every function takes uint8 images (N, H, W) or (N, H, W, C) and their labels and returns
a new (images, labels) pair, uint8. A higher level is a worse model:

- :func:`mode_drop`: ``n_drop`` classes missing (the dropped sets are nested in ``n_drop``
  for a fixed seed), the set resampled from the kept classes to its original size;
- :func:`add_noise`: i.i.d. Gaussian pixel noise of standard deviation ``sigma``
  (grey levels, 0-255 scale);
- :func:`blur`: Gaussian blur of standard deviation ``sigma`` pixels.

Level 0 returns the input images (mode_drop: shuffled). :func:`degrade` dispatches on
a kind name: the config entry ``{kind: blur, sigma: 1.5}`` is
``degrade("blur", images, labels, level=1.5, seed=...)``.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

__all__ = ["DEGRADATIONS", "degrade", "mode_drop", "add_noise", "blur"]


def mode_drop(
    images, labels, *, seed: int, n_drop: int | None = None, keep_classes=None, n: int | None = None
):
    """Drop whole classes, then resample the kept rows to ``n`` images.

    Give exactly one of ``n_drop`` (how many classes to drop: the first ``n_drop`` of a
    seeded permutation of the classes present) or ``keep_classes`` (the classes to keep).
    Every kept row is used ``n // k`` times and a seeded ``n % k`` of them once more
    (k kept rows), so duplicates are as few as the size allows. ``n`` defaults to the
    number of input images.
    """
    images, labels = _check(images, labels, need_labels=True)
    classes = np.unique(labels)
    rng = np.random.default_rng(seed)
    if (n_drop is None) == (keep_classes is None):
        raise ValueError("give exactly one of the arguments 'n_drop' and 'keep_classes'")
    if keep_classes is None:
        if not 0 <= n_drop < len(classes):
            raise ValueError(f"argument 'n_drop' must be in 0..{len(classes) - 1}, got {n_drop}")
        keep_classes = rng.permutation(classes)[n_drop:]
    missing = np.setdiff1d(keep_classes, classes)
    if len(missing) or not len(keep_classes):
        raise ValueError(
            f"argument 'keep_classes' must be classes present in 'labels'; got {list(keep_classes)}"
        )
    n = len(images) if n is None else n
    kept = np.flatnonzero(np.isin(labels, keep_classes))
    rows = np.concatenate(
        [np.tile(kept, n // len(kept)), rng.choice(kept, n % len(kept), replace=False)]
    )
    rows = rng.permutation(rows)
    return images[rows], labels[rows]


def add_noise(images, labels=None, *, sigma: float, seed: int):
    """Add N(0, sigma^2) noise per pixel (grey levels), round and clip to 0..255."""
    images, labels = _check(images, labels)
    if not sigma >= 0:
        raise ValueError(f"argument 'sigma' must be >= 0, got {sigma!r}")
    noise = np.random.default_rng(seed).normal(0.0, sigma, size=images.shape)
    return _to_uint8(images + noise), labels


def blur(images, labels=None, *, sigma: float):
    """Gaussian blur of each image over its two spatial axes (scipy.ndimage, reflect edges)."""
    images, labels = _check(images, labels)
    if not sigma >= 0:
        raise ValueError(f"argument 'sigma' must be >= 0, got {sigma!r}")
    sigmas = (0, sigma, sigma) + (0,) * (images.ndim - 3)
    return _to_uint8(ndimage.gaussian_filter(images.astype(np.float64), sigma=sigmas)), labels


#: kind -> (function, the keyword its level sets)
DEGRADATIONS = {
    "mode_drop": (mode_drop, "n_drop"),
    "noise": (add_noise, "sigma"),
    "blur": (blur, "sigma"),
}


def degrade(kind: str, images, labels, *, level, seed: int):
    """Apply degradation ``kind`` at ``level`` (classes dropped, or sigma)."""
    if kind not in DEGRADATIONS:
        raise ValueError(
            f"argument 'kind': unknown {kind!r}; expected one of {sorted(DEGRADATIONS)}"
        )
    fn, key = DEGRADATIONS[kind]
    extra = {} if fn is blur else {"seed": seed}
    return fn(images, labels, **{key: level}, **extra)


def _check(images, labels, need_labels=False):
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim not in (3, 4):
        raise ValueError(
            f"argument 'images' must be uint8 (N,H,W) or (N,H,W,C), got "
            f"{images.dtype} {images.shape}"
        )
    if labels is None:
        if need_labels:
            raise ValueError("argument 'labels' is required")
        return images, None
    labels = np.asarray(labels)
    if labels.shape != (len(images),) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"argument 'labels' must be {len(images)} ints, got {labels.dtype} {labels.shape}"
        )
    return images, labels.astype(np.int64)


def _to_uint8(x):
    return np.clip(np.round(x), 0, 255).astype(np.uint8)
