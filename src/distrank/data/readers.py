"""Readers for the image-set formats of the full-scale studies.

Each returns ``(images, labels)``: images uint8 (N, H, W, C), labels (N,) or None.

- :func:`read_adm_npz`: guided-diffusion evaluation batches (ImageNet reference
  and sample batches): npz with ``arr_0`` uint8 NHWC and optional ``arr_1`` labels.
- :func:`read_image_folder`: PNG/JPEG folders (AFHQ ``train/cat/*.jpg``, FFHQ
  thumbnails, a user's own samples), labels optionally from subfolder names.
- :func:`read_cifar10_python`: the CIFAR-10 python tarball, read in place.
  Its batches are pickles, so they go through :class:`RestrictedUnpickler`,
  which builds numpy arrays and plain containers and refuses every other global.
"""

from __future__ import annotations

import builtins
import codecs
import os
import pickle
import tarfile
import zipfile
from pathlib import Path

import numpy as np

from .images import check_images

__all__ = [
    "RestrictedUnpickler",
    "UnsafePickleError",
    "cifar10_label_names",
    "decode_image",
    "stack_images",
    "image_files",
    "read_adm_npz",
    "read_cifar10_python",
    "read_image_folder",
    "read_npy_header",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
# PIL modes of grayscale images kept at one channel by decode_image(file, None).
GRAY_MODES = frozenset({"1", "L", "LA"})
# PIL modes with more than 8 bits a sample (16/32-bit integer, float): convert() to "L"
# or "RGB" clips every value above 255 instead of scaling, so they are refused.
WIDE_MODES = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N", "F"})


# ---------------------------------------------------------------------------
# ADM / guided-diffusion npz batches


def read_adm_npz(
    path: str | os.PathLike, *, max_images: int | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Images (``arr_0``, uint8 NHWC) and labels (``arr_1`` as int64, or None).

    The arrays are streamed out of the archive, so ``max_images`` reads only
    the first rows of a 50,000-image batch instead of all ~10 GB.

    Parameters
    ----------
    path : str or os.PathLike
        The npz batch.
    max_images : int, optional
        Read only the first ``max_images`` rows (None: all).

    Returns
    -------
    images : numpy.ndarray of uint8, shape (N, H, W, C)
    labels : numpy.ndarray of int64, shape (N,), or None
        None when the file has no ``arr_1``.
    """
    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path} is not a readable npz file: {err}") from err
    with archive:
        names = archive.namelist()
        if "arr_0.npy" not in names:
            raise KeyError(
                f"{path}: no 'arr_0' array (ADM batch format); keys: "
                f"{', '.join(n.removesuffix('.npy') for n in names) or 'none'}"
            )
        images = _read_npy_rows(archive, "arr_0.npy", max_images, path)
        check_images(images, where=f"{path} key 'arr_0'")
        labels = None
        if "arr_1.npy" in names:
            labels = _read_npy_rows(archive, "arr_1.npy", len(images), path)
            if labels.dtype.kind not in "iu" or labels.ndim != 1:
                raise ValueError(
                    f"{path} key 'arr_1': expected integer labels (N,), "
                    f"got {labels.dtype} {labels.shape}"
                )
            labels = labels.astype(np.int64)
    return images, labels


def read_npy_header(handle) -> tuple[tuple[int, ...], bool, np.dtype]:
    """The header of the .npy file open in ``handle`` (format 1.0, else 2.0).

    Returns
    -------
    (shape, fortran_order, dtype)
        As ``np.lib.format`` reads them; ``handle`` is left at the first data byte.
    """
    version = np.lib.format.read_magic(handle)
    read_header = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    return read_header(handle)


def _read_npy_rows(
    archive: zipfile.ZipFile, name: str, max_rows: int | None, path: Path
) -> np.ndarray:
    """The first ``max_rows`` rows of an .npy member, without pickle."""
    where = f"{path} key {name.removesuffix('.npy')!r}"
    with archive.open(name) as handle:
        try:
            shape, fortran_order, dtype = read_npy_header(handle)
        except ValueError as err:
            raise ValueError(f"{where}: bad .npy header: {err}") from err
        if dtype.hasobject:
            raise ValueError(f"{where}: object arrays need pickle, which is refused")
        if not shape:
            raise ValueError(f"{where}: expected an array with rows, got a scalar")
        rows = shape[0] if max_rows is None else min(max_rows, shape[0])
        if fortran_order:  # rows would not be contiguous; np.savez never writes this
            raise ValueError(f"{where}: Fortran-ordered arrays are not supported")
        array = np.empty((rows, *shape[1:]), dtype=dtype)
        view = memoryview(array.reshape(-1).view(np.uint8)) if array.size else memoryview(b"")
        filled = 0
        while filled < len(view):
            n = handle.readinto(view[filled : filled + (64 << 20)])
            if not n:
                raise ValueError(f"{where}: truncated data ({filled} of {len(view)} bytes)")
            filled += n
    return array


# ---------------------------------------------------------------------------
# Image folders


def read_image_folder(
    path: str | os.PathLike,
    *,
    labels_from_subfolders: bool = False,
    mode: str = "RGB",
    extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
    max_images: int | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Decode every image below ``path`` (recursively, sorted by relative path).

    All images must have the same size: resizing is the feature extractor's
    job, so a mismatch is an error naming the file. Hidden files and macOS
    ``__MACOSX`` folders are skipped.

    Parameters
    ----------
    path : str or os.PathLike
        The folder.
    labels_from_subfolders : bool
        Label each image with the name of the top-level subfolder it lies in
        (``afhq/train/cat/x.jpg`` read from ``afhq/train`` gets ``'cat'``); labels
        are then a unicode array.
    mode : str
        PIL mode to convert to, "RGB" (C = 3) or "L" (C = 1).
    extensions : tuple of str
        File suffixes read, case-insensitive (default ``.png``, ``.jpg``, ``.jpeg``).
    max_images : int, optional
        Read only the first ``max_images`` files of the sorted list.

    Returns
    -------
    images : numpy.ndarray of uint8, shape (N, H, W, C)
    labels : numpy.ndarray of str, shape (N,), or None
        The subfolder names with ``labels_from_subfolders``, else None.

    Raises
    ------
    ValueError
        A bad ``mode``, an image that cannot be decoded or of another size, or (with
        labels) a file directly in ``path``.
    FileNotFoundError
        No image below ``path``.
    NotADirectoryError
        ``path`` is not a folder.
    """
    if mode not in ("RGB", "L"):
        raise ValueError(f"mode must be 'RGB' or 'L', got {mode!r}")
    files, labels = image_files(
        path,
        subfolders="label" if labels_from_subfolders else None,
        extensions=extensions,
        max_images=max_images,
    )
    return stack_images(files, (decode_image(f, mode) for f in files)), labels


def stack_images(files, decoded, *, hint: str = "") -> np.ndarray:
    """One uint8 (N, H, W, C) array of the images ``decoded`` from ``files``, filled as
    they arrive (memory: one set); an image of another size is a ValueError naming both
    files (and ``hint``: what to do about it)."""
    images = None
    for i, (file, pixels) in enumerate(zip(files, decoded)):
        if images is None:
            images = np.empty((len(files), *pixels.shape), dtype=np.uint8)
        elif pixels.shape != images.shape[1:]:
            raise ValueError(
                f"{file} is {pixels.shape[1]}x{pixels.shape[0]} but {files[0]} is "
                f"{images.shape[2]}x{images.shape[1]}; all images of a set must share "
                f"one size{hint}"
            )
        images[i] = pixels
    return images


def decode_image(file: Path, mode: str | None) -> np.ndarray:
    """uint8 (H, W, C) pixels of an 8-bit image file in PIL ``mode`` "L" (C = 1) or "RGB"
    (C = 3; alpha and palettes dropped); ``mode`` None keeps a grayscale file
    (``GRAY_MODES``) at one channel and turns the rest into RGB.

    A file PIL cannot decode (truncated, not an image, absurdly large) and an image of
    more than 8 bits a channel (``WIDE_MODES``) are ValueErrors naming the file.
    """
    from PIL import Image

    try:
        with Image.open(file) as img:
            if img.mode in WIDE_MODES:
                raise ValueError(
                    f"{file}: a {img.mode} image (more than 8 bits a channel), which would be "
                    "clipped at 255; save it with 8 bits a channel"
                )
            target = mode or ("L" if img.mode in GRAY_MODES else "RGB")
            pixels = np.asarray(img.convert(target), dtype=np.uint8)
    except (OSError, SyntaxError, Image.DecompressionBombError) as err:
        # truncated data, not an image, "broken PNG file", absurd sizes
        raise ValueError(f"cannot decode image {file}: {err}") from None
    return pixels[..., np.newaxis] if pixels.ndim == 2 else pixels


def image_files(
    root: str | os.PathLike,
    *,
    subfolders: str | None = None,
    extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
    max_images: int | None = None,
    what: str = "image folder",
) -> tuple[list[Path], np.ndarray | None]:
    """The image files below the folder ``root`` and, with ``subfolders``, their labels.

    Files come recursively, sorted by relative path; hidden files and macOS
    ``__MACOSX`` folders are skipped; ``max_images`` keeps the first ones.
    ``subfolders`` names what a top-level subfolder gives each file below it
    (``"label"``, ``"client"``): the labels are then its name (a unicode array), and
    a file directly in ``root`` is an error. ``what`` names the folder in errors,
    as does a missing folder and one without images.
    """
    root = Path(root)
    if not root.is_dir():
        raise NotADirectoryError(f"{what} {root} does not exist or is not a directory")
    wanted = {e.lower() for e in extensions}
    files = []
    for file in root.rglob("*"):
        relative = file.relative_to(root).parts
        if any(part.startswith(".") or part == "__MACOSX" for part in relative):
            continue
        if file.suffix.lower() in wanted and file.is_file():
            files.append(file)
    files = sorted(files, key=lambda f: f.relative_to(root).as_posix())[:max_images]
    if not files:
        raise FileNotFoundError(f"{what} {root}: no {'/'.join(extensions)} images below it")
    if subfolders is None:
        return files, None
    flat = [f for f in files if len(f.relative_to(root).parts) < 2]
    if flat:
        raise ValueError(
            f"{flat[0]} is not inside a subfolder of {root}, so it has no {subfolders}; "
            f"move it into the subfolder of its {subfolders}"
        )
    return files, np.array([f.relative_to(root).parts[0] for f in files])


# ---------------------------------------------------------------------------
# CIFAR-10 python tarball

CIFAR10_BATCHES = {
    "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test": ("test_batch",),
}


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle asked for a global outside the allow-list.

    Parameters
    ----------
    *args
        Those of the base exception: one message naming the pickle's source and the
        refused global.
    """


def _numpy_globals() -> dict[tuple[str, str], object]:
    # Take the callables from numpy's own reducers instead of importing private
    # modules: the pickles name them under numpy.core (numpy 1) or numpy._core (2).
    reconstruct = np.zeros(1).__reduce_ex__(2)[0]
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]
    scalar = np.float64(0).__reduce__()[0]
    allowed = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
    for package in ("numpy.core", "numpy._core"):
        allowed[(f"{package}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{package}.multiarray", "scalar")] = scalar
        allowed[(f"{package}.numeric", "_frombuffer")] = frombuffer
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that can build numpy arrays, numbers, strings and containers only.

    ``pickle`` calls :meth:`find_class` for every global a pickle references;
    refusing all but a short list of data constructors means loading the file
    cannot run code (no ``os.system``, no ``eval``, no arbitrary class).
    """

    ALLOWED = {
        **_numpy_globals(),
        # Python 3 writes bytes as _codecs.encode(str, "latin1") under protocol <= 2.
        ("_codecs", "encode"): codecs.encode,
        **{
            (module, name): getattr(builtins, name)
            for module in ("builtins", "__builtin__")  # Python 3 and Python 2 pickles
            for name in ("set", "frozenset", "bytearray", "complex")
        },
    }

    def __init__(self, file, *, source: str = "pickle", encoding: str = "bytes"):
        super().__init__(file, encoding=encoding)
        self.source = source

    def find_class(self, module: str, name: str):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"{self.source}: refusing to load global {module}.{name}; only numpy arrays and "
                "plain data are allowed in this file"
            ) from None


def read_cifar10_python(
    tar_path: str | os.PathLike, split: str = "train"
) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 (N, 32, 32, 3) and labels int64 from ``cifar-10-python.tar.gz``.

    The batches are read from the tarball directly; nothing is extracted.

    Parameters
    ----------
    tar_path : str or os.PathLike
        The CIFAR-10 python tarball.
    split : {"train", "test"}
        "train" (data_batch_1..5, 50,000 images) or "test" (test_batch, 10,000).

    Returns
    -------
    images : numpy.ndarray of uint8, shape (N, 32, 32, 3)
    labels : numpy.ndarray of int64, shape (N,)

    Raises
    ------
    UnsafePickleError
        A batch's pickle names a global outside the allow-list.
    ValueError
        An unknown ``split``, or a batch of the wrong form.
    """
    if split not in CIFAR10_BATCHES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    images, labels = [], []
    with tarfile.open(tar_path, "r:*") as archive:
        for name in CIFAR10_BATCHES[split]:
            batch = _load_cifar_member(archive, name, tar_path)
            data, batch_labels = _get(batch, "data", name), _get(batch, "labels", name)
            data = np.asarray(data)
            batch_labels = np.asarray(batch_labels, dtype=np.int64)
            if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
                raise ValueError(
                    f"{tar_path}:{name}: 'data' must be uint8 (N, 3072), "
                    f"got {data.dtype} {data.shape}"
                )
            if batch_labels.shape != (len(data),):
                raise ValueError(
                    f"{tar_path}:{name}: {len(data)} images but {batch_labels.shape} labels"
                )
            # Rows hold the red, green, then blue 32x32 planes.
            images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels.append(batch_labels)
    return np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels)


def cifar10_label_names(tar_path: str | os.PathLike) -> list[str]:
    """Class names from the tarball's ``batches.meta`` (index = label).

    Parameters
    ----------
    tar_path : str or os.PathLike
        The CIFAR-10 python tarball.

    Returns
    -------
    list of str
        One name per label, in label order.
    """
    with tarfile.open(tar_path, "r:*") as archive:
        meta = _load_cifar_member(archive, "batches.meta", tar_path)
    return [
        n.decode() if isinstance(n, bytes) else str(n)
        for n in _get(meta, "label_names", "batches.meta")
    ]


def _load_cifar_member(archive: tarfile.TarFile, name: str, tar_path) -> dict:
    members = [m for m in archive.getmembers() if m.isfile() and Path(m.name).name == name]
    if len(members) != 1:
        raise KeyError(
            f"{tar_path}: expected one member named {name!r} "
            f"(e.g. cifar-10-batches-py/{name}), found {len(members)}"
        )
    handle = archive.extractfile(members[0])
    batch = RestrictedUnpickler(handle, source=f"{tar_path}:{members[0].name}").load()
    if not isinstance(batch, dict):
        raise ValueError(
            f"{tar_path}:{members[0].name}: expected a pickled dict, got {type(batch).__name__}"
        )
    return batch


def _get(batch: dict, key: str, name: str):
    for candidate in (key.encode(), key):  # bytes keys in the real files (Python 2 pickles)
        if candidate in batch:
            return batch[candidate]
    raise KeyError(f"CIFAR-10 batch {name} has no {key!r} entry (keys: {sorted(map(str, batch))})")
