"""A user's inputs as features: feature npz files, image folders, image npz files and
CSV manifests (:mod:`distrank.data.folders`), each with its clients where it names them.

:class:`InputFeatures` reads a feature npz (``features`` (n, d) and, for client-split
reference data, ``clients``) and extracts images through the feature cache
(:func:`distrank.features.cache.cached_input_features`) with one extractor, built on
first need. :func:`extract_inputs` joins several inputs into one feature file's
arrays and metadata (``distrank extract``); :func:`scoring_inputs` reads a reference
(one file or one per client) and the models (``distrank score``). Every problem with
an input is an :class:`~distrank._checks.InputError` that names its file.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from distrank._checks import InputError
from distrank._io import text_digest

__all__ = ["InputFeatures", "Part", "ScoringInputs", "extract_inputs", "scoring_inputs"]


@dataclass
class Part:
    """The features of one input path, its clients (or None) and their metadata."""

    path: Path
    features: np.ndarray
    clients: np.ndarray | None
    meta: dict


@dataclass
class InputFeatures:
    """Features of input paths: feature npz files are read, images extracted through the
    cache with one extractor, built on first need. A context manager (``no_cache``
    extracts into a temporary folder removed on exit).

    ``extractor``, ``backend`` (``"auto"``: onnx on the CPU where the extractor has it,
    else torch), ``device`` and ``weights_dir`` choose the network; ``cache_dir``,
    ``batch_size`` and ``workers`` are those of ``cached_input_features``.
    """

    extractor_name: str
    backend: str = "auto"
    device: str | None = None
    weights_dir: Path | None = None
    cache_dir: Path | None = None
    no_cache: bool = False
    batch_size: int | None = None
    workers: int = 1
    _extractor: object = field(default=None, init=False, repr=False)
    _tmp: object = field(default=None, init=False, repr=False)

    def __enter__(self) -> InputFeatures:
        return self

    def __exit__(self, *exc) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    @property
    def extractor(self):
        if self._extractor is None:
            from distrank.features import get_extractor
            from distrank.features.base import backends, cuda_possible, device_type, resolve_device

            backend = self.backend
            if backend == "auto":  # where no GPU can be, the onnx path never imports torch
                if self.device is not None:
                    on_cpu = device_type(self.device) == "cpu"
                else:
                    on_cpu = not cuda_possible() or resolve_device(None).type == "cpu"
                backend = "onnx" if on_cpu and "onnx" in backends(self.extractor_name) else "torch"
            device = None if backend == "onnx" else self.device
            self._extractor = get_extractor(
                self.extractor_name, backend=backend, device=device, cache_dir=self.weights_dir
            )
        return self._extractor

    def of(
        self,
        path: Path,
        *,
        client: str | None = None,
        subfolders: bool = False,
        need_clients: bool = False,
        d: int | None = None,
        d_source=None,
    ) -> Part:
        """Features of ``path``; ``client`` names every row's client, ``subfolders``
        takes clients from a folder's subfolders, ``need_clients`` requires clients;
        ``d`` is the dimension they must have, that of the reference ``d_source``."""
        from distrank.data.folders import input_kind, open_images

        kind = input_kind(path)
        if kind == "features":
            part = _feature_file(path, need_clients and client is None, d, d_source)
        else:
            if kind == "images" and need_clients and client is None:
                raise InputError(
                    "an image npz has no clients; give each client as "
                    "--client NAME=PATH, or a folder with one subfolder per "
                    "client, or a manifest with a 'client' column",
                    path=path,
                )
            image_input, clients = open_images(
                path, clients_from_subfolders=subfolders and kind == "folder" and client is None
            )
            if need_clients and client is None and clients is None:
                raise InputError("the manifest has no 'client' column", path=path)
            features, meta = self._extract(image_input)
            if d is not None and features.shape[1] != d:
                raise InputError(
                    f"{self.extractor.name} features have dimension "
                    f"{features.shape[1]}, but the reference {d_source} has {d}",
                    path=path,
                )
            part = Part(path, features, clients, meta)
        if client is not None:
            part.clients = np.full(len(part.features), client)
        return part

    def _extract(self, image_input) -> tuple[np.ndarray, dict]:
        from distrank.features.cache import cached_input_features

        cache_dir = self.cache_dir
        if self.no_cache:
            self._tmp = self._tmp or tempfile.TemporaryDirectory(prefix="distrank-features-")
            cache_dir = self._tmp.name
        return cached_input_features(
            image_input,
            self.extractor,
            cache_dir=cache_dir,
            batch_size=self.batch_size,
            workers=self.workers,
        )


def _feature_file(path: Path, need_clients: bool, d, d_source) -> Part:
    from distrank.features.cache import load_features, read_array, read_meta

    features = load_features(path, "features", d=d, d_source=d_source)
    clients = None
    if need_clients:
        clients = read_array(path, "clients")
        if clients.ndim != 1 or len(clients) != len(features):
            raise InputError(
                f"'clients' has shape {clients.shape}; expected "
                f"({len(features)},), one label per row of 'features'",
                path=path,
                key="clients",
            )
        if clients.dtype.kind not in "iuU":
            raise InputError(
                f"'clients' must hold int or str labels, got {clients.dtype}",
                path=path,
                key="clients",
            )
    return Part(path, features, clients, read_meta(path))


def extract_inputs(
    features: InputFeatures,
    sources: Sequence[tuple[Path, str | None]],
    *,
    subfolders: bool = False,
) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays (``features``, and ``clients`` when the inputs name them) and the
    metadata of one feature file of ``sources`` ((path, client name or None), rows
    concatenated in order); ``subfolders``: a folder's subfolders are its clients."""
    from distrank.features.cache import input_metadata

    if not sources:
        raise InputError("give at least one INPUT or --client NAME=PATH")
    parts = [features.of(path, client=name, subfolders=subfolders) for path, name in sources]
    with_clients = [p.clients is not None for p in parts]
    if any(with_clients) and not all(with_clients):
        bare = next(p.path for p in parts if p.clients is None)
        raise InputError(
            "has no clients, but other inputs do; give every input its clients "
            "(--client NAME=PATH, a manifest 'client' column or --client-subfolders)",
            path=bare,
        )
    arrays = {"features": np.concatenate([p.features for p in parts])}
    if all(with_clients):
        arrays["clients"] = np.concatenate([p.clients.astype(str) for p in parts])
    inputs = [{"path": str(p.path), **{k: p.meta[k] for k in ("n", "input_sha256")}} for p in parts]
    digest = text_digest("".join(i["input_sha256"] for i in inputs))
    meta = input_metadata(
        features.extractor,
        n=len(arrays["features"]),
        input_sha256=digest,
        input_shape=parts[0].meta["input_shape"] if len(parts) == 1 else None,
        extra_meta={"inputs": inputs, "clients": "clients" in arrays},
    )
    return arrays, meta


@dataclass
class ScoringInputs:
    """What a scorer is run on: reference rows, their clients, the models, which file
    each client and model came from, and metadata on them (``extractor``,
    ``reference`` and ``models``: each one's ``n`` and ``path``)."""

    reference: np.ndarray
    clients: np.ndarray
    models: dict[str, np.ndarray]
    client_paths: dict[str, Path]
    model_paths: dict[str, Path]
    reference_path: Path | None
    meta: dict = field(default_factory=dict)

    def path_of(self, subject) -> Path | None:
        """The file of an input named by an ``InputError.subject`` (None if unknown)."""
        kind, name = subject or (None, None)
        if kind == "model":
            return self.model_paths.get(name)
        if kind == "client" and name in self.client_paths:
            return self.client_paths[name]
        return self.reference_path if kind in ("reference", "client") else None

    def blame(self, err: ValueError) -> ValueError:
        """``err`` naming the file of the input it is about, when it is an
        ``InputError`` with a ``subject``."""
        if isinstance(err, InputError):
            return err.at(self.path_of(err.subject))
        return err


def scoring_inputs(
    features: InputFeatures,
    *,
    reference: Path | None = None,
    clients: Sequence[tuple[str, Path]] = (),
    models: Sequence[tuple[str, Path]],
) -> ScoringInputs:
    """Read or extract the reference (one file with clients, or one per client) and
    every model's features; names given twice, a model of another dimension and
    inputs of different extractors are :class:`~distrank._checks.InputError`."""
    if reference is not None:
        ref = features.of(reference, subfolders=True, need_clients=True)
        x, labels = ref.features, ref.clients
        if reference.is_dir():
            client_paths = {str(c): reference / str(c) for c in np.unique(labels)}
        else:
            client_paths = {str(c): reference for c in np.unique(labels)}
        parts = [ref]
    else:
        names = [name for name, _ in clients]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise InputError(f"--client: client name {duplicate!r} given twice")
        parts = [features.of(path, client=name) for name, path in clients]
        x = np.concatenate([p.features for p in parts])
        labels = np.concatenate([p.clients for p in parts])
        client_paths = dict(clients)
    ys, model_paths = {}, {}
    for name, path in models:
        if name in ys:
            raise InputError(f"--model: model name {name!r} given twice")
        part = features.of(path, d=x.shape[1], d_source=reference or parts[0].path)
        ys[name], model_paths[name] = part.features, path
        parts.append(part)
    extractors = {str(p.path): p.meta.get("extractor") for p in parts if p.meta.get("extractor")}
    if len(set(extractors.values())) > 1:
        raise InputError(
            "inputs come from different feature extractors: "
            + ", ".join(f"{path} ({name})" for path, name in extractors.items())
        )
    sizes = dict(zip(*np.unique(labels.astype(str), return_counts=True)))
    meta = {
        "extractor": next(iter(extractors.values()), None),
        "reference": {
            str(c): {"n": int(sizes[str(c)]), "path": str(p)} for c, p in client_paths.items()
        },
        "models": {name: {"n": int(len(ys[name])), "path": str(model_paths[name])} for name in ys},
    }
    return ScoringInputs(x, labels, ys, client_paths, model_paths, reference, meta)
