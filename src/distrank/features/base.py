"""The extractor protocol and the registry of named feature networks.

An :class:`Extractor` turns uint8 images (N, H, W, C) into float32 features
(N, d). Everything that determines those numbers - network, weights (by
sha256), backend, device type, preprocessing and package versions - is in
:meth:`Extractor.metadata`, which the feature cache compares exactly.

Precision: features are always computed in float32, with autocast (mixed
precision) off and TF32 matmuls/convolutions disabled on CUDA. FD and KD are
sensitive to small feature perturbations: FD's trace term and KD's polynomial
kernel amplify per-feature errors of 1e-3 (bf16/fp16/TF32 rounding) into
score changes comparable to the differences between good models, and those
errors differ between devices, so a reduced-precision cache would not be
comparable across runs.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import logging
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from distrank._progress import progress

from .preprocess import check_images

__all__ = [
    "Extractor",
    "available_extractors",
    "backends",
    "cuda_possible",
    "device_type",
    "get_extractor",
    "extractor_from_config",
    "package_versions",
    "register_extractor",
    "resolve_device",
]

log = logging.getLogger(__name__)

# name -> "module:factory" (imported on first use, so that e.g. timm is only
# imported when a DINOv2 extractor is asked for) or a callable.
_REGISTRY: dict[str, str | Callable[..., Extractor]] = {
    "efficientnet_lite0": "distrank.features.efficientnet:build_efficientnet_lite0",
    "inception": "distrank.features.inception:build_inception",
    "dinov2_vits14": "distrank.features.dinov2:build_dinov2_vits14",
    "dinov2_vitb14": "distrank.features.dinov2:build_dinov2_vitb14",
    "dinov2_vitl14": "distrank.features.dinov2:build_dinov2_vitl14",
}

BACKENDS = ("torch", "onnx")
# The extractors that also run under onnxruntime (every one runs under torch).
_ONNX = frozenset({"efficientnet_lite0", "inception"})


def register_extractor(name: str, factory: str | Callable[..., Extractor]) -> None:
    """Register a factory ``f(*, backend, device, cache_dir, **kwargs) -> Extractor``
    under ``name``.

    Parameters
    ----------
    name : str
        The name :func:`get_extractor` will resolve.
    factory : str or callable
        The factory, or ``"module:attribute"`` naming it (imported on first use).

    Raises
    ------
    ValueError
        An extractor named ``name`` is already registered.
    """
    if name in _REGISTRY:
        raise ValueError(f"an extractor named {name!r} is already registered")
    _REGISTRY[name] = factory


def available_extractors() -> list[str]:
    """Names that :func:`get_extractor` resolves.

    Returns
    -------
    list of str
        The registered names, sorted.
    """
    return sorted(_REGISTRY)


def backends(name: str) -> tuple[str, ...]:
    """The backends the named extractor can be built with (``"torch"`` always)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown extractor {name!r}; choose one of {available_extractors()}")
    return BACKENDS if name in _ONNX else ("torch",)


def get_extractor(
    name: str = "efficientnet_lite0",
    backend: str = "torch",
    device: str | torch.device | None = None,
    cache_dir: str | None = None,
    **kwargs,
) -> Extractor:
    """Build the named extractor.

    Parameters
    ----------
    name : str
        One of :func:`available_extractors` ("efficientnet_lite0", the default,
        "inception", "dinov2_vitl14", ...).
    backend : {"torch", "onnx"}
        "torch" (eager PyTorch, the default) or "onnx" (onnxruntime on CPU, for the
        extractors that support it: efficientnet_lite0, inception).
    device : str or torch.device, optional
        Torch device for the torch backend; None picks CUDA when available, else CPU.
    cache_dir : str, optional
        The weights directory: downloaded weights and the ONNX export
        live here. None means ``$DISTRANK_WEIGHTS_DIR``, else
        ``$DISTRANK_CACHE_DIR/weights``, else the user's cache
        (``~/.cache/distrank/weights``; see :func:`distrank.features.weights.weights_dir`).
    **kwargs
        Extractor-specific options (e.g. ``num_threads`` for onnx,
        ``offline`` for weights downloads).

    Returns
    -------
    Extractor
        What the name's registered factory builds.

    Raises
    ------
    ValueError
        An unknown ``name`` or ``backend``.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown extractor {name!r}; choose one of {available_extractors()}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    factory = _REGISTRY[name]
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory(backend=backend, device=device, cache_dir=cache_dir, **kwargs)


def extractor_from_config(features: dict, *, device=None, threads: int = 1) -> Extractor:
    """The extractor of a study config's ``features`` section (``extractor``,
    ``backend``, ``weights_dir``: null is ``$DISTRANK_WEIGHTS_DIR``, else the study's
    ``resources/weights``, :func:`~distrank.features.weights.study_weights_dir`), with
    ``threads`` onnxruntime threads.

    Parameters
    ----------
    features : dict
        The ``features`` section: ``extractor`` and ``backend`` (required) and
        ``weights_dir`` (optional).
    device : str or torch.device, optional
        Those of :func:`get_extractor`.
    threads : int
        onnxruntime threads (``num_threads``) of the onnx backend; unused by torch.

    Returns
    -------
    Extractor
        Built by :func:`get_extractor`.
    """
    from .weights import study_weights_dir

    options = {"num_threads": threads} if features["backend"] == "onnx" else {}
    return get_extractor(
        features["extractor"],
        backend=features["backend"],
        device=device,
        cache_dir=study_weights_dir(features.get("weights_dir")),
        **options,
    )


def package_versions(*names: str) -> dict[str, str]:
    """Installed versions of the given distributions (those that change the features)."""
    return {n: importlib.metadata.version(n) for n in names}


if TYPE_CHECKING:
    import torch


def resolve_device(device=None) -> torch.device:
    """``distrank._arrays.resolve_device`` (imports torch on first call)."""
    from distrank import _arrays

    return _arrays.resolve_device(device)


def device_type(device) -> str:
    """``"cpu"``, ``"cuda"``, ...: a torch device's type, or that of its name, without
    importing torch."""
    return getattr(device, "type", None) or str(device).partition(":")[0]


def cuda_possible() -> bool:
    """False where torch certainly finds no CUDA device (macOS; Linux without NVIDIA's or
    AMD's device files), so choosing the CPU needs no import of torch; True where only
    torch can tell."""
    if sys.platform == "darwin":
        return False
    if sys.platform.startswith("linux"):
        nodes = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")
        return any(os.path.exists(node) for node in nodes)
    return True


@contextlib.contextmanager
def full_precision():
    """float32 everywhere: no autocast, no TF32 (restored on exit). See the module docstring."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.autocast("cpu", enabled=False))
            if torch.cuda.is_available():
                stack.enter_context(torch.autocast("cuda", enabled=False))
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class Extractor(ABC):
    """A feature network with a fixed preprocessing.

    Subclasses set ``name``, ``dim``, ``backend``, ``device`` and
    ``preprocessing`` (a :class:`~distrank.features.preprocess.Preprocessing`
    or any object with ``to_dict()``), and implement :meth:`forward_batch`.

    Attributes
    ----------
    name
        str: the extractor's registered name.
    dim
        int: the feature dimension d.
    backend
        str: "torch" or "onnx".
    device
        torch.device: where the network runs.
    default_batch_size
        int: images per forward pass when none is given; 64 unless a subclass sets it.
    """

    name: str
    dim: int
    backend: str
    device: torch.device
    default_batch_size: int = 64

    # --- to implement --------------------------------------------------------------
    @abstractmethod
    def forward_batch(self, images: np.ndarray) -> np.ndarray:
        """uint8 (n, H, W, C) -> float32 (n, dim), preprocessing included."""

    @property
    @abstractmethod
    def preprocessing(self) -> dict:
        """JSON-serialisable description of the preprocessing."""

    @property
    @abstractmethod
    def weights(self) -> dict:
        """The weights in use, as ``{"file": name, "sha256": hex}``."""

    @property
    @abstractmethod
    def versions(self) -> dict[str, str]:
        """Versions of the packages whose code computes the features."""

    # --- shared --------------------------------------------------------------------
    def metadata(self) -> dict:
        """Everything that determines the features; compared exactly by the cache."""
        return {
            "extractor": self.name,
            "backend": self.backend,
            "device": device_type(self.device),
            "d": int(self.dim),
            "preprocessing": self.preprocessing,
            "weights": self.weights,
            "versions": self.versions,
            "precision": "float32",
        }

    def extract(
        self, images: np.ndarray, batch_size: int | None = None, *, desc: str | None = None
    ) -> np.ndarray:
        """Features of uint8 images (N, H, W, C), C = 1 or 3 -> float32 (N, dim).

        ``batch_size`` (default ``default_batch_size``) changes only speed and
        memory, not the features (beyond float rounding in the backend).
        ``desc`` names the step on the progress bar (default: the extractor's name).

        Parameters
        ----------
        images : numpy.ndarray of uint8, shape (N, H, W, C)
            The images, C = 1 or 3.
        batch_size : int, optional
            Images per forward pass, positive.
        desc : str, optional
            The progress bar's label.

        Returns
        -------
        numpy.ndarray of float32, shape (N, dim)

        Raises
        ------
        ValueError
            A ``batch_size`` that is not a positive integer.
        """
        images = check_images(images)
        batch_size = self._check_batch_size(batch_size)
        out = np.empty((len(images), self.dim), dtype=np.float32)
        with progress(total=len(images), desc=desc or self.name, unit="img") as bar:
            for start in range(0, len(images), batch_size):
                stop = min(start + batch_size, len(images))
                out[start:stop] = self.forward_batch(images[start:stop])
                bar.update(stop - start)
        return out

    def extract_batches(self, batches: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """Features of each uint8 NHWC batch of an iterable (e.g. a DataLoader decoding
        in workers).

        Parameters
        ----------
        batches : iterable of numpy.ndarray or torch.Tensor of uint8, each shape (n, H, W, C)
            The batches, read one at a time.

        Yields
        ------
        numpy.ndarray of float32, shape (n, dim)
            The features of each batch, in order.
        """
        torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
        for batch in batches:
            if torch is not None and isinstance(batch, torch.Tensor):
                batch = batch.numpy()
            yield self.forward_batch(check_images(batch, "batch"))

    def _check_batch_size(self, batch_size):
        batch_size = self.default_batch_size if batch_size is None else batch_size
        if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        return int(batch_size)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, backend={self.backend!r}, "
            f"device={str(self.device)!r}, dim={self.dim})"
        )
