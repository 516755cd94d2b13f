"""Data stage: download and verify, extract, decode image sets.

- :mod:`.download` — ``fetch``: streamed, resumable, retried, checksum- or
  lock-file-verified downloads with an atomic rename.
- :mod:`.transfer` — the transfer itself: https only (unless opted out), retries,
  ``Range`` resumes.
- :mod:`.checksums` — verification: published checksums, the checksum lock file,
  GitHub code archives identified by commit and git tree.
- :mod:`.archive` — ``safe_extract``: tar/zip extraction that rejects path escapes.
- :mod:`.fashion_mnist` — the embedded default dataset (IDX files).
- :mod:`.images` — the project's npz image-set format.
- :mod:`.readers` — full-scale formats: ADM npz batches, image folders, CIFAR-10.
"""

from .archive import UnsafeArchiveError, safe_extract
from .checksums import ChecksumError, read_lockfile
from .download import fetch
from .fashion_mnist import CLASS_NAMES as FASHION_MNIST_CLASSES
from .fashion_mnist import load_fashion_mnist
from .images import load_image_meta, load_images, save_images
from .readers import (
    UnsafePickleError,
    cifar10_label_names,
    read_adm_npz,
    read_cifar10_python,
    read_image_folder,
)
from .transfer import DownloadError

__all__ = [
    "FASHION_MNIST_CLASSES",
    "ChecksumError",
    "DownloadError",
    "UnsafeArchiveError",
    "UnsafePickleError",
    "cifar10_label_names",
    "fetch",
    "load_fashion_mnist",
    "load_image_meta",
    "load_images",
    "read_adm_npz",
    "read_cifar10_python",
    "read_image_folder",
    "read_lockfile",
    "safe_extract",
    "save_images",
]
