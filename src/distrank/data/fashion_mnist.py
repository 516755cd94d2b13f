"""Fashion-MNIST (Xiao, Rasul and Vollgraf, 2017): 70,000 28x28 grayscale images, 10 classes.

The data are the four IDX files of the upstream release. They are looked up,
in order, in an explicit ``root``, in the Debian package
``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist/``), and in a
download directory, where they are fetched from the upstream URLs with the
md5s published in the zalandoresearch/fashion-mnist README.

The Debian package recompresses the files, so its ``.gz`` md5s differ from the
published ones; the decompressed IDX bytes are identical. The loader therefore
checks the md5 of the *decompressed* data (``RAW_MD5``), which identifies
the dataset whichever copy it came from.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

from distrank._io import parts_digest

from .download import fetch
from .transfer import DownloadError

__all__ = [
    "CLASS_NAMES",
    "DEBIAN_DIR",
    "FILES",
    "GZ_MD5",
    "MIRRORS",
    "RAW_MD5",
    "find_fashion_mnist",
    "load_fashion_mnist",
    "read_idx",
]

CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

# split -> (images file, labels file)
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
SPLIT_SIZES = {"train": 60_000, "test": 10_000}

# Download locations, tried in order: the upstream repository's copy of the files. The
# S3 site that the upstream README links serves plain http only, which fetch refuses.
MIRRORS = ("https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",)
# md5 of the .gz files, as published in the upstream README ("Get the Data").
GZ_MD5 = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}
# md5 of the decompressed IDX data (the same for upstream and Debian copies).
RAW_MD5 = {
    "train-images-idx3-ubyte.gz": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte.gz": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte.gz": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte.gz": "15d484375f8d13e6eb1aabb0c3f46965",
}
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
DEFAULT_DOWNLOAD_DIR = Path("resources/fashion-mnist")

# IDX type code -> big-endian numpy dtype (http://yann.lecun.com/exdb/mnist/).
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def load_fashion_mnist(
    split: str = "train",
    root: str | os.PathLike | None = None,
    *,
    download_dir: str | os.PathLike = DEFAULT_DOWNLOAD_DIR,
    download: bool = True,
    verify: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 (N, 28, 28) and labels int64 (N,) of a Fashion-MNIST split.

    Parameters
    ----------
    split : str
        "train" (60,000), "test" (10,000) or "all" (train then test).
    root : str or os.PathLike, optional
        A directory holding the four files (``.gz`` or decompressed); when given,
        only it is used.
    download_dir : str or os.PathLike
        Where to fetch the files when neither ``root`` nor the Debian package has
        them.
    download : bool
        Whether fetching them is allowed.
    verify : bool
        Check the decompressed data against ``RAW_MD5`` (turn off only for
        files that are not the real dataset, such as test fixtures).

    Returns
    -------
    images : numpy.ndarray of uint8, shape (N, 28, 28)
    labels : numpy.ndarray of int64, shape (N,)
        Class indices 0..9 into ``CLASS_NAMES``.

    Raises
    ------
    ValueError
        An unknown ``split``, or files that are not the dataset.
    FileNotFoundError
        The files are missing and may not be downloaded.
    """
    if split not in ("train", "test", "all"):
        raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
    directory = find_fashion_mnist(root, download_dir=download_dir, download=download)
    parts = ("train", "test") if split == "all" else (split,)
    images, labels = zip(*(_load_split(directory, part, verify) for part in parts))
    return np.concatenate(images), np.concatenate(labels)


def find_fashion_mnist(
    root: str | os.PathLike | None = None,
    *,
    download_dir: str | os.PathLike = DEFAULT_DOWNLOAD_DIR,
    download: bool = True,
    mirrors: tuple[str, ...] = MIRRORS,
    md5s: dict[str, str] = GZ_MD5,
    allow_http: bool = False,
) -> Path:
    """The directory holding the four IDX files, downloading them if needed
    (``allow_http``: accept plain http mirrors, see :func:`distrank.data.download.fetch`)."""
    if root is not None:
        root = Path(root)
        missing = _missing_files(root)
        if missing:
            raise FileNotFoundError(
                f"Fashion-MNIST root {root} lacks {', '.join(missing)} (each may be gzipped or not)"
            )
        return root
    if not _missing_files(DEBIAN_DIR):
        return DEBIAN_DIR
    download_dir = Path(download_dir)
    if not download:
        raise FileNotFoundError(
            f"Fashion-MNIST not found in {DEBIAN_DIR} (apt install dataset-fashion-mnist) and "
            f"downloading into {download_dir} is disabled"
        )
    for name in md5s:
        _fetch_from_mirrors(name, download_dir / name, md5s[name], mirrors, allow_http)
    return download_dir


def read_idx(path: str | os.PathLike, *, ndim: int | None = None) -> np.ndarray:
    """Parse an IDX file (gzipped or not) into a native-endian numpy array."""
    return _parse_idx(_read_bytes(Path(path)), Path(path), ndim=ndim)


def _fetch_from_mirrors(
    name: str, dest: Path, md5: str, mirrors: tuple[str, ...], allow_http: bool
) -> None:
    errors = []
    for base in mirrors:
        try:
            fetch(base.rstrip("/") + "/" + name, dest, md5=md5, allow_http=allow_http)
            return
        except DownloadError as err:
            errors.append(str(err))
    raise DownloadError(f"could not download {name} from any mirror: " + " | ".join(errors))


def _missing_files(directory: Path) -> list[str]:
    names = [name for pair in FILES.values() for name in pair]
    return [
        n for n in names if not (directory / n).is_file() and not (directory / n[:-3]).is_file()
    ]


def _read_bytes(path: Path) -> bytes:
    """File content, decompressed if it is gzip (recognised by its magic bytes)."""
    with open(path, "rb") as handle:
        gzipped = handle.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    try:
        with opener(path, "rb") as handle:
            return handle.read()
    except (OSError, EOFError) as err:
        raise ValueError(f"cannot read {path}: {err}") from err


def _load_split(directory: Path, split: str, verify: bool) -> tuple[np.ndarray, np.ndarray]:
    arrays = []
    for name, ndim in zip(FILES[split], (3, 1)):
        path = directory / name if (directory / name).is_file() else directory / name[:-3]
        raw = _read_bytes(path)
        if verify:
            actual = parts_digest([raw], "md5")
            if actual != RAW_MD5[name]:
                raise ValueError(
                    f"{path} is not the Fashion-MNIST release: md5 of its "
                    f"decompressed data is {actual}, expected {RAW_MD5[name]}"
                )
        arrays.append(_parse_idx(raw, path, ndim=ndim))
    images, labels = arrays
    if images.dtype != np.uint8 or images.shape[1:] != (28, 28):
        raise ValueError(
            f"{path.parent}: expected uint8 images of 28x28 for split {split!r}, "
            f"got {images.dtype} {images.shape}"
        )
    if len(images) != len(labels):
        raise ValueError(
            f"{directory}: split {split!r} has {len(images)} images but {len(labels)} labels"
        )
    if verify and len(images) != SPLIT_SIZES[split]:  # unreachable if the md5 matched
        raise ValueError(f"{directory}: expected {SPLIT_SIZES[split]} images in {split!r}")
    if labels.size and labels.max() >= len(CLASS_NAMES):
        raise ValueError(f"{directory}: labels of split {split!r} exceed 9 (max {labels.max()})")
    return images, labels.astype(np.int64)


def _parse_idx(raw: bytes, path: Path, *, ndim: int | None) -> np.ndarray:
    if len(raw) < 4:
        raise ValueError(f"{path}: too short for an IDX header ({len(raw)} bytes)")
    zeros, type_code, file_ndim = struct.unpack(">HBB", raw[:4])
    if zeros != 0 or type_code not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (magic number 0x{raw[:4].hex()})")
    if ndim is not None and file_ndim != ndim:
        raise ValueError(f"{path}: expected an IDX file with {ndim} dimensions, found {file_ndim}")
    header = 4 + 4 * file_ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{file_ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: IDX header announces shape {shape} ({expected} bytes of data) "
            f"but the file holds {len(raw) - header} bytes after the header"
        )
    array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)
