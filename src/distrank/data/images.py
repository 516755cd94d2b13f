"""The project's image-set file: an npz with ``images`` and optional ``labels``.

- ``images``: uint8, (N, H, W, C) with C = 1 (grayscale) or 3 (RGB).
- ``labels``: (N,), int64 class indices, or unicode strings (e.g. "cat").
- ``meta``: optional JSON object (provenance: source, split, model, seed, ...),
  stored as a 0-d unicode array so the file stays a single artifact.

Files are written atomically and read with ``allow_pickle=False``.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from distrank._io import atomic_open

__all__ = ["check_images", "load_image_meta", "load_images", "save_images"]


def save_images(
    path: str | os.PathLike,
    images: np.ndarray,
    labels: np.ndarray | None = None,
    *,
    compress: bool = False,
    **meta,
) -> Path:
    """Write an image set to ``path`` (an .npz) atomically and return the path.

    ``images`` must be uint8 (N, H, W, C) with C in {1, 3}; a (N, H, W) array is
    taken as grayscale and stored with C = 1. ``meta`` keyword arguments must
    be JSON-serialisable.

    Parameters
    ----------
    path : str or os.PathLike
        The .npz file to write.
    images : array_like of uint8, shape (N, H, W, C) or (N, H, W)
        The images, C = 1 or 3.
    labels : array_like, shape (N,), optional
        Integer class indices (stored as int64) or unicode strings.
    compress : bool
        Write with ``numpy.savez_compressed`` instead of ``numpy.savez``.
    **meta
        Provenance, stored as one JSON object (:func:`load_image_meta`).

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    ValueError
        Images or labels of the wrong dtype or shape.
    TypeError
        ``meta`` that is not JSON-serialisable.
    """
    path = Path(path)
    images = np.asarray(images)
    if images.ndim == 3:
        images = images[..., np.newaxis]
    check_images(images, where=f"images to be saved in {path}")
    arrays = {"images": images}
    if labels is not None:
        arrays["labels"] = _check_labels(np.asarray(labels), len(images), where=str(path))
    if meta:
        try:
            arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
        except TypeError as err:
            raise TypeError(f"metadata for {path} must be JSON-serialisable: {err}") from err
    with atomic_open(path) as handle:
        (np.savez_compressed if compress else np.savez)(handle, **arrays)
    return path


def load_images(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray | None]:
    """Read an image set: (images uint8 (N, H, W, C), labels (N,) or None).

    Parameters
    ----------
    path : str or os.PathLike
        An .npz image set (:func:`save_images`), read without pickle.

    Returns
    -------
    images : numpy.ndarray of uint8, shape (N, H, W, C)
        C = 1 or 3.
    labels : numpy.ndarray, shape (N,), or None
        int64 class indices or unicode strings; None when the file has none.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    KeyError
        The file has no ``images`` array.
    ValueError
        Not a readable npz, or arrays of the wrong dtype or shape.
    """
    path = Path(path)
    with _open_npz(path) as data:
        if "images" not in data.files:
            raise KeyError(f"{path}: no 'images' array (keys: {', '.join(data.files) or 'none'})")
        images = _read_key(data, "images", path)
        check_images(images, where=f"{path} key 'images'")
        labels = None
        if "labels" in data.files:
            labels = _check_labels(
                _read_key(data, "labels", path), len(images), where=f"{path} key 'labels'"
            )
    return images, labels


def load_image_meta(path: str | os.PathLike) -> dict:
    """The ``meta`` dictionary stored by :func:`save_images` ({} if none).

    Parameters
    ----------
    path : str or os.PathLike
        An .npz image set.

    Returns
    -------
    dict
        The JSON object decoded.
    """
    path = Path(path)
    with _open_npz(path) as data:
        if "meta" not in data.files:
            return {}
        return json.loads(str(_read_key(data, "meta", path)))


def check_images(images: np.ndarray, *, where: str = "images") -> None:
    """Raise ValueError unless ``images`` is uint8 (N, H, W, C) with C in {1, 3}."""
    if images.dtype != np.uint8:
        raise ValueError(f"{where}: expected dtype uint8, got {images.dtype}")
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(
            f"{where}: expected shape (N, H, W, C) with C in {{1, 3}}, got {images.shape}"
        )


def _check_labels(labels: np.ndarray, n: int, *, where: str) -> np.ndarray:
    if labels.shape != (n,):
        raise ValueError(f"{where}: labels must have shape ({n},), got {labels.shape}")
    if labels.dtype.kind in "iu":
        return labels.astype(np.int64)
    if labels.dtype.kind == "U":
        return labels
    raise ValueError(f"{where}: labels must be integers or strings, got dtype {labels.dtype}")


def _open_npz(path: Path):
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"image set {path} does not exist") from None
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path} is not a readable npz file: {err}") from err
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ValueError(f"{path} is a single .npy array, not an npz image set")
    return data


def _read_key(data, key: str, path: Path) -> np.ndarray:
    try:
        return data[key]
    except ValueError as err:  # object arrays need pickle, which is refused
        raise ValueError(f"{path} key {key!r} cannot be read without pickle: {err}") from err
