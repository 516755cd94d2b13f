"""Feature files with metadata, and a cache that never reuses a mismatched file.

A feature file ``<out>.npz`` holds ``features`` float32 (N, d) and, when the
image file has them, its ``labels``. Beside it, ``<out>.meta.json`` records
everything that determines the features: the extractor's metadata (name,
backend, device type, dim, preprocessing, weights sha256, package versions,
precision), the image file's sha256 and shape, and the caller's
``extra_meta`` (dataset, split, model, ... ; any JSON values).

:func:`cached_features` reuses a file only when its sidecar equals the
requested metadata exactly (after a JSON round trip); anything else - another
preprocessing, other weights, another torch, changed images - recomputes.

Writes are atomic: the old sidecar is removed first, then the features and
finally the new sidecar are written to temporary files and renamed into place,
so a sidecar on disk always describes the features beside it.

:func:`cached_input_features` does the same for a user's images as the CLI reads
them (a folder, a CSV manifest or an image npz; :mod:`distrank.data.folders`):
the input is identified by its content digest, and the file lives in a cache
folder (:func:`default_cache_dir`) under a name derived from the metadata.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import numpy as np

from distrank._checks import InputError
from distrank._io import atomic_open, file_digest, text_digest, user_cache_dir
from distrank._progress import progress

__all__ = [
    "cache_file",
    "cached_features",
    "cached_input_features",
    "default_cache_dir",
    "extract_to_file",
    "input_metadata",
    "load_features",
    "meta_path",
    "read_array",
    "read_meta",
    "requested_metadata",
    "write_features",
]

FORMAT = "distrank.features/1"
ENV_CACHE_DIR = "DISTRANK_CACHE_DIR"
_RESERVED = frozenset(
    {
        "format",
        "extractor",
        "backend",
        "device",
        "d",
        "n",
        "preprocessing",
        "weights",
        "versions",
        "precision",
        "input_sha256",
        "input_shape",
        "labels",
    }
)


def meta_path(out_npz: str | os.PathLike) -> Path:
    """The metadata sidecar of a feature file: ``<out>.meta.json``."""
    out = Path(out_npz)
    return out.with_name(out.name + ".meta.json")


def _npz_member_shape(path: Path, key: str) -> tuple[tuple[int, ...], np.dtype] | None:
    """Shape and dtype of one array in an npz, read from its header (the data stay
    compressed)."""
    from distrank.data.readers import read_npy_header

    with zipfile.ZipFile(path) as archive:
        name = f"{key}.npy"
        if name not in archive.namelist():
            return None
        with archive.open(name) as member:
            shape, _, dtype = read_npy_header(member)
    return tuple(shape), np.dtype(dtype)


def _image_file_info(images_npz: Path) -> tuple[tuple[int, ...], bool]:
    info = _npz_member_shape(images_npz, "images")
    if info is None:
        raise ValueError(f"{images_npz} has no 'images' array")
    shape, dtype = info
    if dtype != np.uint8 or len(shape) != 4 or shape[-1] not in (1, 3):
        raise ValueError(
            f"{images_npz}: 'images' must be uint8 (N, H, W, C) with C = 1 or 3, "
            f"got {dtype} {shape}"
        )
    return shape, _npz_member_shape(images_npz, "labels") is not None


def _json_normal(obj) -> dict:
    return json.loads(json.dumps(obj, sort_keys=True))


def requested_metadata(
    images_npz: str | os.PathLike, extractor, extra_meta: dict | None = None
) -> dict:
    """The sidecar that features of ``images_npz`` by ``extractor`` must carry."""
    images_npz = Path(images_npz)
    shape, has_labels = _image_file_info(images_npz)
    return input_metadata(
        extractor,
        n=int(shape[0]),
        input_sha256=file_digest(images_npz),
        input_shape=[int(s) for s in shape],
        labels=has_labels,
        extra_meta=extra_meta,
    )


def input_metadata(
    extractor,
    *,
    n: int,
    input_sha256: str,
    input_shape: list[int] | None,
    labels: bool = False,
    extra_meta: dict | None = None,
) -> dict:
    """The sidecar of features of any input: the extractor's metadata, the input's
    rows, content digest and shape (None where images differ in size), whether
    labels are copied, and the caller's ``extra_meta``."""
    extra = dict(extra_meta or {})
    clash = _RESERVED.intersection(extra)
    if clash:
        raise ValueError(f"extra_meta may not set the reserved keys {sorted(clash)}")
    meta = {
        "format": FORMAT,
        **extractor.metadata(),
        "n": int(n),
        "input_sha256": input_sha256,
        "input_shape": input_shape,
        "labels": bool(labels),
        **extra,
    }
    return _json_normal(meta)


def extract_to_file(
    images_npz: str | os.PathLike,
    out_npz: str | os.PathLike,
    extractor,
    *,
    batch_size: int | None = None,
    extra_meta: dict | None = None,
) -> dict:
    """Extract features of an image file into ``out_npz`` (+ sidecar); return the metadata.

    ``images_npz`` holds ``images`` uint8 (N, H, W, C) and optionally ``labels``,
    which are copied. ``batch_size`` affects speed and memory only and is not
    recorded.

    Parameters
    ----------
    images_npz : str or os.PathLike
        The image file: ``images`` uint8 (N, H, W, C), C = 1 or 3, optionally ``labels``.
    out_npz : str or os.PathLike
        The feature file; its sidecar is ``<out_npz>.meta.json`` (:func:`meta_path`).
    extractor : Extractor
        The feature network (``get_extractor``).
    batch_size : int, optional
        Images per forward pass (None: the extractor's default).
    extra_meta : dict, optional
        JSON values recorded in the sidecar beside the extractor's metadata.

    Returns
    -------
    dict
        The metadata written to the sidecar, after a JSON round trip.

    Raises
    ------
    ValueError
        ``images_npz`` has no ``images`` array of uint8 (N, H, W, C), C = 1 or 3, or
        ``extra_meta`` sets a reserved key (``format``, ``extractor``, ``n``, ...).
    RuntimeError
        The image file changed while being read, or the extractor returned another shape or dtype.
    """
    images_npz, out_npz = Path(images_npz), Path(out_npz)
    meta = requested_metadata(images_npz, extractor, extra_meta)
    _extract(images_npz, out_npz, extractor, meta, batch_size)
    return meta


def _extract(
    images_npz: Path, out_npz: Path, extractor, meta: dict, batch_size: int | None
) -> None:
    with np.load(images_npz, allow_pickle=False) as data:
        images = data["images"]
        labels = data["labels"] if "labels" in data.files else None
    if len(images) != meta["n"]:
        raise RuntimeError(f"{images_npz} changed while it was being read")
    features = extractor.extract(images, batch_size=batch_size, desc=f"extract {images_npz.name}")
    arrays = {"features": features}
    if labels is not None:
        arrays["labels"] = labels
    write_features(out_npz, arrays, meta)


def write_features(out_npz: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Write ``arrays`` (``features`` float32 (n, d), optionally ``labels``, ``clients``)
    to ``out_npz`` and ``meta`` to its sidecar, atomically: the old sidecar goes first,
    the new one last, so a sidecar always describes the features beside it."""
    features = arrays["features"]
    if features.shape != (meta["n"], meta["d"]) or features.dtype != np.float32:
        raise RuntimeError(
            f"extractor returned {features.dtype} {features.shape}, "
            f"expected float32 {(meta['n'], meta['d'])}"
        )
    sidecar = meta_path(out_npz)
    sidecar.unlink(missing_ok=True)  # never leave an old sidecar beside new features
    with atomic_open(out_npz) as handle:
        np.savez(handle, **arrays)
    text = json.dumps(meta, indent=2, sort_keys=True) + "\n"
    with atomic_open(sidecar, "w", encoding="utf-8") as handle:
        handle.write(text)


_REQUIRED = object()


def read_array(path: str | os.PathLike, key: str = "features", default=_REQUIRED) -> np.ndarray:
    """The array ``key`` of an npz file, never unpickled; a missing or unreadable file,
    a single array, a missing key (unless a ``default`` is given) or an object array
    raise :class:`~distrank._checks.InputError` naming the file and the key."""
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None
    except (ValueError, OSError, EOFError) as err:
        raise InputError(f"not a readable npz archive ({err})", path=path) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise InputError("expected an npz archive, got a single array", path=path)
    with archive:
        if key not in archive.files:
            if default is not _REQUIRED:
                return default
            raise InputError(f"no {key!r} array (has {sorted(archive.files)})", path=path, key=key)
        try:
            return archive[key]
        except ValueError as err:  # e.g. an object array, which would need pickle
            raise InputError(
                f"cannot read {key!r} without pickle ({err})", path=path, key=key
            ) from None


def load_features(
    path: str | os.PathLike, key: str = "features", *, d: int | None = None, d_source=None
) -> np.ndarray:
    """The feature matrix ``key`` (non-empty, numeric, finite (rows, d)) of an npz file
    (:func:`read_array`); ``d`` is the dimension it must have, that of ``d_source``.
    Every problem is an :class:`~distrank._checks.InputError` naming file and key."""
    x = read_array(path, key)
    if x.ndim != 2 or 0 in x.shape:
        raise InputError(
            f"{key!r} has shape {x.shape}; expected non-empty (rows, d)", path=path, key=key
        )
    if x.dtype.kind not in "iuf":
        raise InputError(f"{key!r} must be numeric, got {x.dtype}", path=path, key=key)
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).any(axis=1).sum())
        raise InputError(f"{key!r} has NaN or infinite values in {bad} rows", path=path, key=key)
    if d is not None and x.shape[1] != d:
        raise InputError(
            f"{key!r} has dimension {x.shape[1]}, but the reference {d_source} has {d}",
            path=path,
            key=key,
        )
    return x


def load_labelled(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray | None]:
    """The features of a reference file (:func:`load_features`) and its class labels
    (``labels``; None where the file has none, as FFHQ's)."""
    return load_features(path), read_array(path, "labels", default=None)


def read_meta(path: str | os.PathLike) -> dict:
    """The metadata sidecar of a feature file (:func:`meta_path`), {} when it has none."""
    sidecar = meta_path(path)
    if not sidecar.is_file():
        return {}
    try:
        return json.loads(sidecar.read_text(encoding="utf-8"))
    except ValueError as err:
        raise InputError(f"not valid JSON ({err})", path=sidecar) from None


def _reusable(out_npz: Path, wanted: dict) -> bool:
    sidecar = meta_path(out_npz)
    if not (out_npz.is_file() and sidecar.is_file()):
        return False
    try:
        existing = json.loads(sidecar.read_text(encoding="utf-8"))
        if existing != wanted:
            return False
        info = _npz_member_shape(out_npz, "features")
    except (OSError, ValueError, zipfile.BadZipFile):
        return False
    return info is not None and info == ((wanted["n"], wanted["d"]), np.dtype(np.float32))


def cached_features(
    images_npz: str | os.PathLike,
    out_npz: str | os.PathLike,
    extractor,
    *,
    batch_size: int | None = None,
    extra_meta: dict | None = None,
) -> np.ndarray:
    """Features of ``images_npz``: read from ``out_npz`` if its metadata matches exactly,
    else extracted.

    Returns the float32 (N, d) features; the file and sidecar are (re)written
    whenever they are missing, unreadable or describe anything else.

    Parameters
    ----------
    images_npz, out_npz, extractor, batch_size, extra_meta
        Those of :func:`extract_to_file`.

    Returns
    -------
    numpy.ndarray of float32, shape (N, d)
        The ``features`` array of ``out_npz``; the errors are those of
        :func:`extract_to_file`.
    """
    images_npz, out_npz = Path(images_npz), Path(out_npz)
    wanted = requested_metadata(images_npz, extractor, extra_meta)
    if not _reusable(out_npz, wanted):
        _extract(images_npz, out_npz, extractor, wanted, batch_size)
    return read_array(out_npz)


def cached_input_features(
    image_input,
    extractor,
    *,
    cache_dir: str | os.PathLike | None = None,
    batch_size: int | None = None,
    workers: int = 1,
    extra_meta: dict | None = None,
    desc: str | None = None,
) -> tuple[np.ndarray, dict]:
    """Features of an image folder, manifest or image npz (a :mod:`distrank.data.folders`
    input) and their metadata, read from the cache when a file there matches exactly,
    else extracted into it.

    The input is identified by its content digest (``image_input.describe()``), so a
    changed file recomputes. Images of different sizes are batched separately.

    Parameters
    ----------
    cache_dir : str or os.PathLike, optional
        The cache folder (None: :func:`default_cache_dir`); the file is
        :func:`cache_file` of the metadata, so each (input, extractor, options) has
        its own.
    batch_size : int, optional
        Images per forward pass (default: the extractor's); it does not change the
        features beyond float rounding.
    workers : int
        Decoding processes; they do not change the features.
    desc : str, optional
        The step's name on the progress bar.
    """
    wanted = input_metadata(extractor, **image_input.describe(), extra_meta=extra_meta)
    out_npz = cache_file(default_cache_dir() if cache_dir is None else cache_dir, wanted)
    if not _reusable(out_npz, wanted):
        features = np.empty((wanted["n"], extractor.dim), dtype=np.float32)
        with progress(
            total=wanted["n"], desc=desc or f"extract {image_input.where}", unit="img"
        ) as bar:
            batches = image_input.batches(extractor._check_batch_size(batch_size), workers)
            for rows, images in batches:
                features[rows] = extractor.forward_batch(images)
                bar.update(len(rows))
        write_features(out_npz, {"features": features}, wanted)
    return read_array(out_npz), wanted


def cache_file(cache_dir: str | os.PathLike, meta: dict) -> Path:
    """Where :func:`cached_input_features` keeps features of the given metadata in a
    cache folder: one file per (input, extractor, options), named by their digest."""
    digest = text_digest(json.dumps(meta, sort_keys=True))[:24]
    return Path(cache_dir) / f"{meta['extractor']}-{digest}.npz"


def default_cache_dir() -> Path:
    """``$DISTRANK_CACHE_DIR``, else ``$XDG_CACHE_HOME/distrank/features`` (``~/.cache``)."""
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR])
    return user_cache_dir("features")
