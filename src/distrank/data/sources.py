"""Image sets named in a study's config (real data or a model's samples), decoded.

A *source* is a small mapping from the config, e.g.::

    {kind: fashion_mnist, split: train, root: null}
    {kind: npz, artifact: biggan_deep_imagenet256, max_images: 10000}
    {kind: cifar10, artifact: cifar10_python, split: test}
    {kind: folder, artifact: afhq, subdir: afhq/train, labels_from_subfolders: true,
     resolution: 256, max_per_class: 500}
    {kind: folder, path: /data/my_samples}

Kinds and their keys:

- ``fashion_mnist``: ``split`` (train | test | all), ``root`` (folder with the IDX
  files, or null for the Debian package / a download).
- ``npz``: an ADM / guided-diffusion batch (``arr_0`` uint8 NHWC, optional ``arr_1``
  int labels; read streaming, so ``max_images`` reads only the first rows) or the
  project's own image-set npz (``images``, optional ``labels``).
- ``cifar10``: the CIFAR-10 python tarball (not extracted; its pickles go through
  a restricted unpickler), ``split`` (train | test).
- ``folder``: PNG / JPEG files below a directory (recursively, in sorted path
  order), optionally below ``subdir``; ``labels_from_subfolders`` labels each image
  with its top-level subfolder below that (AFHQ: ``afhq/train/{cat,dog,wild}``).
  ``exclude`` lists names of files or folders below it to leave out wherever they
  are (FFHQ's reference: ``["69000"]``, the held-out folder), and
  ``expect_images`` the number of images the folder must then hold, so an
  incomplete download fails naming the count instead of shifting the sets.

Where the files are: every kind but ``fashion_mnist`` takes exactly one of
``artifact`` (a name from the config's ``downloads:``, looked up in the ``paths``
mapping the pipeline passes: the downloaded file, or the extraction directory of
an archive) or ``path`` (a local file or directory, e.g. a user's own samples).

Every kind accepts ``labels``, what the config declares about the source's labels:
``false`` (label-free: any labels are dropped, and the config checks refuse class
partitions over it before anything is downloaded), ``true`` or a list of the config
keys that need them (labels required: reading the source fails at once, naming the
artifact and those keys, if it has none; an npz is checked for ``arr_1`` before any
image is read). Absent: whatever the files hold.

Keys every kind accepts, applied in this order:

- ``max_per_class``: keep the first N images of each class (labelled sets only).
- ``max_images``: keep the first N images.
- ``resolution``: resize to this size (an int for square images, or
  ``[height, width]``) with PIL's bicubic filter. Without it, images of
  different sizes in one source are an error naming the file.

Both limits are "first in source order", so they are deterministic and need no
seed. For folders they are applied to the file list before decoding, and each
image is resized as it is decoded, so memory is bounded by the output.

Labels are int64 class indices. String labels (subfolder names, string labels
in an npz) are mapped to ints in sorted order of the names, and the names are
returned in :attr:`ImageSet.label_names` (index = label). The mapping is taken
from all classes of the source, before any limit, so it does not depend on
``max_images``.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from .fashion_mnist import CLASS_NAMES as FASHION_MNIST_CLASSES
from .fashion_mnist import load_fashion_mnist
from .images import check_images, load_images
from .readers import (
    cifar10_label_names,
    decode_image,
    image_files,
    read_adm_npz,
    read_cifar10_python,
    stack_images,
)

__all__ = ["KINDS", "ImageSet", "MissingLabelsError", "load_source", "resize_images"]

_LIMITS = frozenset({"max_images", "max_per_class", "resolution", "labels"})
_LOCATION = frozenset({"artifact", "path"})

#: kind -> the keys a source of that kind may have (besides ``kind``).
KINDS: dict[str, frozenset[str]] = {
    "fashion_mnist": frozenset({"split", "root"}) | _LIMITS,
    "npz": _LOCATION | _LIMITS,
    "cifar10": _LOCATION | {"split"} | _LIMITS,
    "folder": _LOCATION
    | {"subdir", "labels_from_subfolders", "exclude", "expect_images"}
    | _LIMITS,
}


class MissingLabelsError(ValueError):
    """A source declared ``labels: true`` (or the keys needing them) has no labels."""


@dataclass(frozen=True)
class ImageSet:
    """Decoded images of a source; unpacks like the former return value
    (``images, labels = load_source(...)``).

    Attributes
    ----------
    images : np.ndarray
        uint8 (N, H, W, C), C in {1, 3}.
    labels : np.ndarray or None
        int64 (N,), or None for unlabelled sources.
    label_names : tuple of str or None
        Class names, ``label_names[k]`` naming label k; None for unnamed or absent labels.
    """

    images: np.ndarray
    labels: np.ndarray | None = None
    label_names: tuple[str, ...] | None = None

    def __iter__(self):
        return iter((self.images, self.labels))

    def __len__(self) -> int:
        return len(self.images)


def load_source(
    source: Mapping, *, paths: Mapping[str, str | os.PathLike] | None = None, workers: int = 1
) -> ImageSet:
    """Decode the image set that a config ``source`` entry names (see the module doc).

    Parameters
    ----------
    paths : mapping, optional
        Artifact name -> local path (the downloaded file, or the directory an
        archive was extracted to); needed for sources given by ``artifact``.
    workers : int
        Processes that decode the files of a folder source.
    """
    kind = source.get("kind")
    if kind not in KINDS:
        raise ValueError(
            f"source {dict(source)}: 'kind' must be one of {sorted(KINDS)}, got {kind!r}"
        )
    unknown = set(source) - KINDS[kind] - {"kind"}
    if unknown:
        raise ValueError(
            f"source of kind {kind!r}: unknown key(s) {sorted(unknown)}; "
            f"allowed: {sorted(KINDS[kind])}"
        )
    limits = _Limits.of(source)
    required = _required_labels(source)
    if kind == "npz" and required is not None:
        _check_npz_labels(_location(source, paths), source, required)
    if kind == "fashion_mnist":
        images, labels = load_fashion_mnist(_required(source, "split"), root=source.get("root"))
        image_set = ImageSet(images[..., np.newaxis], labels, FASHION_MNIST_CLASSES)
    elif kind == "npz":
        image_set = _load_npz(_location(source, paths), limits)
    elif kind == "cifar10":
        path = _location(source, paths)
        images, labels = read_cifar10_python(path, _required(source, "split"))
        image_set = ImageSet(images, labels, tuple(cifar10_label_names(path)))
    else:
        image_set = _load_folder(_location(source, paths), source, limits, workers)
    if source.get("labels") is False:
        image_set = ImageSet(image_set.images)
    elif required is not None and image_set.labels is None:
        raise MissingLabelsError(_missing_labels(source, required, "it has no labels"))
    return limits.apply(image_set)


def _required_labels(source: Mapping) -> list[str] | None:
    """None unless the source declares its labels required: then the keys needing them."""
    value = source.get("labels")
    if value is None or value is False:
        return None
    if value is True:
        return []
    if isinstance(value, Sequence) and not isinstance(value, str) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
    raise ValueError(
        f"source key 'labels' must be true, false or a list of the config keys that need "
        f"the labels, got {value!r}"
    )


def _missing_labels(source: Mapping, required: list[str], why: str) -> str:
    where = f"artifact {source['artifact']!r}" if "artifact" in source else repr(source.get("path"))
    needs = f" {', '.join(required)} need(s) them" if required else ""
    return (
        f"the {source['kind']} source {where} has no class labels ({why}), but the config "
        f"declares it labelled (labels: {source['labels']!r}):{needs or ' labels required'}. "
        "Label-free route: partition the reference by k-means on its features "
        "(kind: kmeans) and declare labels: false"
    )


def _check_npz_labels(path: Path, source: Mapping, required: list[str]) -> None:
    """Fail before any image is read when a labelled npz has no label array."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = {n.removesuffix(".npy") for n in archive.namelist()}
    except (OSError, zipfile.BadZipFile):
        return  # _load_npz reports the unreadable file
    if ("arr_0" in names and "arr_1" not in names) or ("images" in names and "labels" not in names):
        raise MissingLabelsError(
            _missing_labels(
                source, required, f"{path} holds {', '.join(sorted(names))}: no arr_1 or labels"
            )
        )


# ---------------------------------------------------------------------------
# Limits: max_per_class, max_images, resolution


@dataclass(frozen=True)
class _Limits:
    max_images: int | None
    max_per_class: int | None
    resolution: tuple[int, int] | None

    @classmethod
    def of(cls, source: Mapping) -> _Limits:
        for key in ("max_images", "max_per_class"):
            value = source.get(key)
            if value is not None and (not _is_int(value) or value < 1):
                raise ValueError(f"source key {key!r} must be a positive integer, got {value!r}")
        return cls(
            source.get("max_images"),
            source.get("max_per_class"),
            _resolution(source.get("resolution")),
        )

    def rows(self, labels: np.ndarray | None, n: int, where: str) -> np.ndarray:
        """Indices of the rows to keep, in source order."""
        rows = np.arange(n)
        if self.max_per_class is not None:
            if labels is None:
                raise ValueError(f"{where}: 'max_per_class' needs labels, and this source has none")
            rank = np.empty(n, dtype=np.int64)  # position of each row within its class
            for label in np.unique(labels):
                members = np.flatnonzero(labels == label)
                rank[members] = np.arange(len(members))
            rows = rows[rank < self.max_per_class]
        if self.max_images is not None:
            rows = rows[: self.max_images]
        return rows

    def apply(self, image_set: ImageSet) -> ImageSet:
        # Idempotent, so readers that already applied the limits (folders, streamed
        # npz batches) pass through unchanged.
        images, labels = image_set.images, image_set.labels
        rows = self.rows(labels, len(images), "source")
        if len(rows) < len(images):
            images = images[rows]
            labels = None if labels is None else labels[rows]
        if self.resolution is not None:
            images = resize_images(images, self.resolution)
        return ImageSet(images, labels, image_set.label_names)


def resize_images(images: np.ndarray, resolution: tuple[int, int]) -> np.ndarray:
    """Resize uint8 (N, H, W, C) images to ``resolution`` = (height, width), PIL bicubic.

    Images already at that size are returned unchanged (no copy).
    """
    height, width = resolution
    if images.shape[1:3] == (height, width):
        return images
    out = np.empty((len(images), height, width, images.shape[3]), dtype=np.uint8)
    for i, image in enumerate(images):
        out[i] = _resize(image, resolution)
    return out


def _resize(image: np.ndarray, resolution: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    height, width = resolution
    if image.shape[:2] == (height, width):
        return image
    grey = image.shape[2] == 1
    pil = Image.fromarray(image[..., 0] if grey else image)
    resized = np.asarray(pil.resize((width, height), Image.Resampling.BICUBIC), dtype=np.uint8)
    return resized[..., np.newaxis] if grey else resized


def _resolution(value) -> tuple[int, int] | None:
    if value is None:
        return None
    if _is_int(value):
        value = (value, value)
    if (
        not isinstance(value, Sequence)
        or isinstance(value, str)
        or len(value) != 2
        or not all(_is_int(v) and v >= 1 for v in value)
    ):
        raise ValueError(
            f"source key 'resolution' must be a positive integer or [height, width], got {value!r}"
        )
    return int(value[0]), int(value[1])


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# ---------------------------------------------------------------------------
# Locations


def _location(source: Mapping, paths: Mapping | None) -> Path:
    given = _LOCATION & set(source)
    if len(given) != 1:
        raise ValueError(
            f"source of kind {source['kind']!r} needs exactly one of 'artifact' "
            f"(a name from the config's downloads) or 'path', got {sorted(given)}"
        )
    if "path" in source:
        path = Path(source["path"])
    else:
        name = source["artifact"]
        if not paths or name not in paths:
            known = ", ".join(sorted(paths or {})) or "none"
            raise KeyError(
                f"source artifact {name!r} has no local path: the caller must pass "
                f"paths={{{name!r}: <downloaded file or extracted folder>}} "
                f"(artifacts passed: {known})"
            )
        path = Path(paths[name])
    if not path.exists():
        raise FileNotFoundError(f"source of kind {source['kind']!r}: {path} does not exist")
    return path


def _required(source: Mapping, key: str):
    if source.get(key) is None:
        raise ValueError(f"source of kind {source['kind']!r} needs the key {key!r}")
    return source[key]


# ---------------------------------------------------------------------------
# npz: ADM batches and the project's image sets


def _load_npz(path: Path, limits: _Limits) -> ImageSet:
    if path.is_dir():
        raise IsADirectoryError(
            f"npz source {path} is a directory; 'npz' needs an .npz file "
            "(use kind 'folder' for image files)"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path} is not a readable npz file: {err}") from err
    if "arr_0.npy" in names:
        # Streamed: only the first max_images rows are read from a 50k-image batch.
        stream_limit = limits.max_images if limits.max_per_class is None else None
        images, labels = read_adm_npz(path, max_images=stream_limit)
        return ImageSet(images, labels)
    if "images.npy" in names:
        images, labels = load_images(path)
        labels, label_names = _encode_labels(labels)
        return ImageSet(images, labels, label_names)
    raise KeyError(
        f"{path}: neither 'arr_0' (ADM batch) nor 'images' (distrank image set) "
        f"found; keys: {', '.join(sorted(n.removesuffix('.npy') for n in names))}"
    )


def _encode_labels(labels: np.ndarray | None) -> tuple[np.ndarray | None, tuple[str, ...] | None]:
    """String labels -> (int64 indices in sorted name order, names); ints pass through."""
    if labels is None or labels.dtype.kind != "U":
        return labels, None
    names, codes = np.unique(labels, return_inverse=True)
    return codes.astype(np.int64), tuple(str(n) for n in names)


# ---------------------------------------------------------------------------
# Image folders


def _load_folder(location: Path, source: Mapping, limits: _Limits, workers: int) -> ImageSet:
    root = location / source["subdir"] if source.get("subdir") else location
    files, labels = image_files(
        root,
        subfolders="label" if source.get("labels_from_subfolders", False) else None,
        what="folder source",
    )
    files, labels = _excluded(root, files, labels, source.get("exclude") or ())
    expected = source.get("expect_images")
    if expected is not None and (not _is_int(expected) or expected < 1):
        raise ValueError(f"source key 'expect_images' must be a positive integer, got {expected!r}")
    if expected is not None and len(files) != expected:
        excluded = f" (without {list(source['exclude'])})" if source.get("exclude") else ""
        raise ValueError(
            f"folder source {root}: expect_images is {expected}, but it holds {len(files)} "
            f"images{excluded}: the folder is incomplete or not the one meant"
        )
    labels, label_names = _encode_labels(labels)
    rows = limits.rows(labels, len(files), f"folder source {root}")
    files = [files[i] for i in rows]
    if labels is not None:
        labels = labels[rows]
    return ImageSet(_decode(files, limits.resolution, workers), labels, label_names)


def _excluded(root: Path, files: list[Path], labels, exclude) -> tuple[list[Path], object]:
    """``files`` (and their labels) without those a name of ``exclude`` lies on the path of."""
    if isinstance(exclude, str) or not all(isinstance(e, str) and e for e in exclude):
        raise ValueError(f"source key 'exclude' must be a list of names, got {exclude!r}")
    if not exclude:
        return files, labels
    names = set(exclude)
    keep = [i for i, f in enumerate(files) if not names & set(f.relative_to(root).parts)]
    if not keep:
        raise FileNotFoundError(f"folder source {root}: no images left after exclude {exclude}")
    return [files[i] for i in keep], None if labels is None else labels[keep]


def _decode(files: list[Path], resolution: tuple[int, int] | None, workers: int = 1) -> np.ndarray:
    """Decode ``files`` to RGB uint8 (N, H, W, 3), resizing each as it is read, in
    ``workers`` processes (decoding JPEG/PNG is the slow part of reading a folder)."""
    decode = partial(_decode_one, resolution=resolution)
    if workers > 1 and len(files) > 1:
        with ProcessPoolExecutor(workers) as pool:
            pixels = pool.map(decode, files, chunksize=max(1, min(256, len(files) // workers)))
            return _stack(files, pixels)
    return _stack(files, map(decode, files))


def _decode_one(file: Path, resolution: tuple[int, int] | None) -> np.ndarray:
    pixels = decode_image(file, "RGB")
    return pixels if resolution is None else _resize(pixels, resolution)


def _stack(files: list[Path], decoded) -> np.ndarray:
    """One array from decoded images (``readers.stack_images``), checked."""
    hint = ", or give the source a 'resolution' to resize them to"
    images = stack_images(files, decoded, hint=hint)
    check_images(images, where=f"images below {files[0].parent}")
    return images
