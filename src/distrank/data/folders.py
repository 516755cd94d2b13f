"""A user's images as they lie on disk: folders, image npz batches and CSV manifests.

:func:`open_images` turns a path into an image input (rows to extract features
from) and, where the path says so, the client of every row:

- a **folder**: every ``.png``, ``.jpg``, ``.jpeg`` and ``.webp`` file below it,
  recursively, in sorted order of the relative path (hidden files and
  ``__MACOSX`` skipped; :func:`distrank.data.readers.image_files`). With
  ``clients_from_subfolders``, each top-level subfolder is a client
  (``ref/hospital_a/*.png``, ``ref/hospital_b/*.png``), named after the subfolder.
- an **image npz**: ``arr_0`` (ADM / guided-diffusion batches) or ``images`` (the
  project's image sets), uint8 (N, H, W, C); see :mod:`distrank.data.sources`.
- a **CSV manifest** with a header row, a ``path`` column (relative to the
  manifest's folder, or absolute) and optionally a ``client`` column; rows keep the
  manifest's order.

Decoding (PIL) keeps grayscale files at one channel and turns everything else
into RGB; it happens in batches, ahead of the consumer, so memory holds a few
batches, not the set. Images keep their own size: :meth:`ImageFiles.batches`
groups each batch by size, and the feature extractor's documented preprocessing
resizes every image to the network's input (:mod:`distrank.features.preprocess`),
so a folder of mixed sizes is not an error. Rows come back with their indices, so features land
in file order whatever the grouping.

:meth:`ImageFiles.describe` identifies an input for the feature cache
(:func:`distrank.features.cache.cached_input_features`): the number of rows and a
sha256 of the content (for files: the sha256 of their concatenated sha256
digests, in row order, so renaming files keeps the identity and editing one
changes it).
"""

from __future__ import annotations

import csv
import functools
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from distrank._checks import positive_int
from distrank._io import file_digest, parts_digest

from .readers import IMAGE_EXTENSIONS as _READER_EXTENSIONS
from .readers import decode_image, image_files
from .sources import ImageSet, load_source

__all__ = [
    "IMAGE_EXTENSIONS",
    "ImageArchive",
    "ImageFiles",
    "input_kind",
    "open_images",
    "read_manifest",
]

IMAGE_EXTENSIONS = (*_READER_EXTENSIONS, ".webp")
MANIFEST_SUFFIX = ".csv"


@dataclass(frozen=True)
class ImageFiles:
    """Image files in row order; ``where`` (a folder or manifest) names them in messages."""

    files: tuple[Path, ...]
    where: Path

    def __post_init__(self):
        if not self.files:
            raise ValueError(f"{self.where}: no images")

    def __len__(self) -> int:
        return len(self.files)

    def describe(self) -> dict:
        """``n``, ``input_sha256`` (of the files' sha256 digests in order), ``input_shape`` None."""
        digest = parts_digest(_file_digest(file) for file in self.files)
        return {"n": len(self.files), "input_sha256": digest, "input_shape": None}

    def batches(self, batch_size: int, workers: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(row indices, uint8 (b, H, W, 3) images of one size), covering every row once.

        Files are decoded ``batch_size`` at a time, ahead of the consumer: in
        ``workers`` processes, or in a thread of this one when ``workers`` is 1.
        """
        batch_size, workers = (
            positive_int(batch_size, "batch_size"),
            positive_int(workers, "workers"),
        )
        chunks = [self.files[i : i + batch_size] for i in range(0, len(self.files), batch_size)]
        for start, images in zip(
            range(0, len(self.files), batch_size), _decode_chunks(chunks, workers)
        ):
            yield from _by_size(start, images)


class ImageArchive:
    """The images of an npz (``arr_0`` or ``images``), read once on first use."""

    def __init__(self, path: str | os.PathLike):
        self.path = self.where = Path(path)

    @functools.cached_property
    def image_set(self) -> ImageSet:
        return load_source({"kind": "npz", "path": str(self.path)})

    def __len__(self) -> int:
        return len(self.image_set)

    def describe(self) -> dict:
        """``n``, ``input_sha256`` (of the npz file) and ``input_shape`` (N, H, W, C)."""
        images = self.image_set.images
        return {
            "n": len(images),
            "input_sha256": _file_digest(self.path).hex(),
            "input_shape": [int(s) for s in images.shape],
        }

    def batches(self, batch_size: int, workers: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(row indices, uint8 images) ``batch_size`` rows at a time (``workers`` unused:
        the archive is decoded already)."""
        batch_size = positive_int(batch_size, "batch_size")
        images = self.image_set.images
        for start in range(0, len(images), batch_size):
            stop = min(start + batch_size, len(images))
            yield np.arange(start, stop), images[start:stop]


ImageInput = ImageFiles | ImageArchive


def input_kind(path: str | os.PathLike) -> str:
    """What ``path`` holds: ``"folder"``, ``"manifest"`` (.csv), ``"features"`` (an npz
    with ``features``) or ``"images"`` (an npz with ``arr_0`` or ``images``)."""
    import zipfile

    path = Path(path)
    if path.is_dir():
        return "folder"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or folder")
    if path.suffix.lower() == MANIFEST_SUFFIX:
        return "manifest"
    try:
        with zipfile.ZipFile(path) as archive:
            names = {n.removesuffix(".npy") for n in archive.namelist()}
    except (OSError, zipfile.BadZipFile) as err:
        raise ValueError(
            f"{path}: expected an image folder, a .csv manifest or an .npz archive "
            f"of features or images; cannot read it as npz ({err})"
        ) from None
    if "features" in names:
        return "features"
    if names & {"arr_0", "images"}:
        return "images"
    raise ValueError(
        f"{path}: an npz needs 'features', 'images' or 'arr_0'; it has {sorted(names)}"
    )


def open_images(
    path: str | os.PathLike, *, clients_from_subfolders: bool = False
) -> tuple[ImageInput, np.ndarray | None]:
    """The image input at ``path`` (folder, image npz or manifest) and its clients or None.

    clients_from_subfolders : for a folder, the top-level subfolder of each image
        is its client (str labels); an image directly in the folder is an error.
    """
    path = Path(path)
    kind = input_kind(path)
    if clients_from_subfolders and kind != "folder":
        raise ValueError(f"{path}: clients from subfolders need a folder, got a {kind} file")
    if kind == "manifest":
        return read_manifest(path)
    if kind == "images":
        return ImageArchive(path), None
    if kind == "features":
        raise ValueError(f"{path} holds features, not images")
    files, clients = image_files(
        path,
        subfolders="client" if clients_from_subfolders else None,
        extensions=IMAGE_EXTENSIONS,
        what="folder",
    )
    return ImageFiles(tuple(files), path), clients


def read_manifest(path: str | os.PathLike) -> tuple[ImageFiles, np.ndarray | None]:
    """The files of a CSV manifest (columns ``path`` and optionally ``client``), in order.

    Relative paths are taken from the manifest's folder. A missing file, an empty
    path or client, and a manifest without rows are errors naming the manifest line.
    """
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            columns, rows = reader.fieldnames or [], list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ValueError(f"{path}: not a readable CSV manifest ({err})") from None
    if "path" not in columns:
        raise ValueError(
            f"{path}: a manifest needs a 'path' column (and optionally 'client'); "
            f"its header is {list(columns)}"
        )
    if not rows:
        raise ValueError(f"{path}: the manifest lists no images")
    has_clients = "client" in columns
    files, clients = [], []
    for line, row in enumerate(rows, start=2):  # line 1 is the header
        name = (row.get("path") or "").strip()
        if not name:
            raise ValueError(f"{path} line {line}: empty 'path'")
        file = Path(name) if Path(name).is_absolute() else path.parent / name
        if not file.is_file():
            raise FileNotFoundError(f"{path} line {line}: image {file} does not exist")
        files.append(file)
        if has_clients:
            client = (row.get("client") or "").strip()
            if not client:
                raise ValueError(f"{path} line {line}: empty 'client' for {file}")
            clients.append(client)
    return ImageFiles(tuple(files), path), np.array(clients) if has_clients else None


# ---------------------------------------------------------------------------
# Decoding in batches


def _decode_all(files: Sequence[Path]) -> list[np.ndarray]:
    """Grayscale files at one channel (the extractors repeat it to RGB after resizing,
    which gives the features of the RGB copy at a third of the preprocessing work)."""
    return [decode_image(f, None) for f in files]


def _decode_chunks(chunks: list, workers: int) -> Iterator[list[np.ndarray]]:
    """Decoded chunks in order, decoded ahead of the consumer (at most ``2 * workers``
    chunks) by ``workers`` processes, or by one thread when ``workers`` is 1: PIL
    releases the GIL while decoding, so it overlaps the consumer's forward passes."""
    if len(chunks) == 1:
        yield _decode_all(chunks[0])
        return
    pool = ThreadPoolExecutor(1) if workers == 1 else ProcessPoolExecutor(workers)
    with pool:
        todo = iter(chunks)
        pending = deque(pool.submit(_decode_all, c) for c in islice(todo, 2 * workers))
        try:
            while pending:
                images = pending.popleft().result()
                pending.extend(pool.submit(_decode_all, c) for c in islice(todo, 1))
                yield images
        finally:
            for future in pending:
                future.cancel()


def _by_size(start: int, images: list[np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault(image.shape, []).append(i)
    for rows in groups.values():
        yield start + np.array(rows), np.stack([images[i] for i in rows])


def _file_digest(file: Path) -> bytes:
    try:
        return bytes.fromhex(file_digest(file))
    except OSError as err:
        raise ValueError(f"cannot read image {file}: {err.strerror or err}") from None
