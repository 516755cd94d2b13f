"""Image preprocessing for the feature networks: uint8 NHWC in, normalised float32 NCHW out.

Every extractor states its preprocessing as a :class:`Preprocessing` value whose
:meth:`~Preprocessing.to_dict` is stored beside every feature file, so a cache
made with another resolution, interpolation or normalisation is never mistaken
for this one.

The steps, in order::

    uint8 (N, H, W, C), C in {1, 3}
    -> float32 (N, C, H, W), values in [0, 255]
    -> resize to ``size``                  # per channel; optionally rounded and
                                           #   clamped to [0, 255] as PIL does
    -> y = (x * scale - mean) / std        # per output channel; a C=1 (grayscale)
                                           #   image is repeated to all 3 channels

How the resize is computed: torch's separable interpolation (bilinear,
bicubic, with or without antialiasing, ``align_corners=False``), or TensorFlow
1.x's bilinear resize as torch-fidelity ports it ("bilinear_tf1", the FID
Inception-v3's). For small inputs (both sides <= 64 px: Fashion-MNIST,
CIFAR-10) it is applied as a linear map per axis, ``Y = R_h X R_w^T``, with the
two matrices obtained by running the interpolation itself on an identity matrix:
exactly its weights. Two small matrix products are far cheaper on a CPU than
``F.interpolate`` (about 1 % of EfficientNet-Lite0's time at 128 px, against
~20 % for ``F.interpolate`` with its thread pool on 2 busy cores). Larger
inputs use the interpolation itself, whose sparse kernels win there. Both give
the same numbers to float32 rounding (~1e-4 on the 0-255 scale), and the choice
depends only on the input size, so equal images always take the same path.
CPU batches are resized in numpy, CUDA batches by torch on the GPU.
Resizing one grayscale channel and repeating it equals repeating first, since
channels are resized independently.

The matrices are torch's own weights, so making one imports torch (in a child process
where the caller has not imported it, :mod:`distrank.features.torch_child`); a preprocessing
:meth:`~Preprocessing.stored` in a folder (the onnx backends': beside their export) keeps
each one it makes there as ``.npy`` (named by torch's version), and a later process reads
it back, the same float32 numbers, without importing torch.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from distrank._blas import blas_libraries

if TYPE_CHECKING:
    import torch

__all__ = ["Preprocessing", "check_images", "interpolate", "resize_matrix"]
__all__ += ["stored_resize_matrix"]

INTERPOLATIONS = ("bilinear", "bicubic", "bilinear_tf1")
_IMPLEMENTATION = dict.fromkeys(("bilinear", "bicubic"), "torch F.interpolate")
_IMPLEMENTATION["bilinear_tf1"] = "torch-fidelity interpolate_bilinear_2d_like_tensorflow1x"
# Inputs up to this side length are resized by dense matrix products (see the module docstring).
MATRIX_MAX_SIDE = 64


def check_images(images, name: str = "images") -> np.ndarray:
    """Validate an image batch: a uint8 numpy array (N, H, W, C) with C = 1 or 3."""
    if not isinstance(images, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(images).__name__}")
    if images.dtype != np.uint8:
        raise ValueError(f"{name} must have dtype uint8, got {images.dtype}")
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(f"{name} must have shape (N, H, W, C) with C = 1 or 3, got {images.shape}")
    if images.shape[1] < 1 or images.shape[2] < 1:
        raise ValueError(f"{name} has an empty spatial size: {images.shape}")
    return images


@functools.lru_cache(maxsize=64)
def resize_matrix(n_in: int, n_out: int, interpolation: str, antialias: bool) -> np.ndarray:
    """(n_out, n_in) float32 matrix of torch's 1-D interpolation weights (align_corners=False).

    Row i holds the weights output pixel i gives each input pixel; resizing a
    length-n_in signal v is ``R @ v``. Made by resizing the identity along one
    axis (the other axis keeps its size, which torch maps to the identity).
    """
    import torch

    eye = torch.eye(n_in, dtype=torch.float32).view(1, 1, n_in, n_in)
    with torch.no_grad():
        rows = interpolate(eye, (n_out, n_in), interpolation, antialias)
    return rows[0, 0].to(torch.float32).numpy()


def interpolate(x: torch.Tensor, size, interpolation: str, antialias: bool) -> torch.Tensor:
    """Resize float NCHW ``x`` to ``size``: torch's ``F.interpolate`` (``align_corners=False``),
    or for "bilinear_tf1" TensorFlow 1.x's bilinear resize (no half-pixel offset: source
    pixel ``j * n_in / n_out``), as torch-fidelity ports it for the FID Inception-v3."""
    if interpolation == "bilinear_tf1":
        from torch_fidelity.interpolate_compat_tensorflow import (
            interpolate_bilinear_2d_like_tensorflow1x,
        )

        return interpolate_bilinear_2d_like_tensorflow1x(x, size=tuple(size), align_corners=False)
    import torch.nn.functional as F

    return F.interpolate(
        x, size=tuple(size), mode=interpolation, align_corners=False, antialias=antialias
    )


@dataclass(frozen=True)
class Preprocessing:
    """A fixed, documented image preprocessing (see the module docstring).

    Parameters
    ----------
    size : output (height, width) in pixels.
    interpolation : "bilinear" or "bicubic" (torch's kernels, ``align_corners=False``), or
        "bilinear_tf1" (TensorFlow 1.x's bilinear, the FID Inception-v3's; no antialias).
    antialias : low-pass filtering when shrinking (torch's ``antialias=True``,
        PIL's convention). When enlarging it changes nothing for bilinear, and
        for bicubic it selects PIL's cubic kernel (a = -0.5) over torch's
        default (a = -0.75).
    round_to_uint8 : round the resized values half-up and clamp them to
        [0, 255], as resizing a PIL image does (used where the reference
        pipeline resizes PIL images).
    scale, mean, std : per-channel normalisation ``(x * scale - mean) / std``.
    """

    size: tuple[int, int]
    interpolation: str
    antialias: bool
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    scale: float = 1.0
    round_to_uint8: bool = False
    #: where resize matrices are kept between processes (not part of the description)
    store: Path | None = field(default=None, compare=False, repr=False)

    def stored(self, folder: str | os.PathLike) -> Preprocessing:
        """The same preprocessing, its resize matrices kept in ``folder``
        (:func:`stored_resize_matrix`)."""
        return dataclasses.replace(self, store=Path(folder))

    def __post_init__(self):
        if len(self.size) != 2 or min(self.size) < 1:
            raise ValueError(f"size must be (height, width) with positive entries, got {self.size}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(
                f"interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}"
            )
        if self.interpolation == "bilinear_tf1" and self.antialias:
            raise ValueError("interpolation 'bilinear_tf1' has no antialiased form")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError("mean and std must have 3 entries, std positive")

    def to_dict(self) -> dict:
        """JSON-serialisable description, stored in every feature file's metadata."""
        return {
            "input": "uint8 NHWC, C=1 (grayscale) or C=3 (RGB)",
            "grayscale": "repeat to 3 channels",
            "resize": {
                "size": [int(self.size[0]), int(self.size[1])],
                "interpolation": self.interpolation,
                "antialias": bool(self.antialias),
                "align_corners": False,
                "round_to_uint8": bool(self.round_to_uint8),
                "implementation": f"{_IMPLEMENTATION[self.interpolation]} weights "
                "(as R_h @ X @ R_w^T for inputs up to 64 px)",
            },
            "normalize": {
                "formula": "(x * scale - mean) / std, x in [0, 255]",
                "scale": float(self.scale),
                "mean": [float(v) for v in self.mean],
                "std": [float(v) for v in self.std],
            },
            "output": "float32 NCHW",
        }

    def _matrices(self, height: int, width: int):
        if self.store is None:
            made = functools.partial(resize_matrix, interpolation=self.interpolation)
        else:
            made = functools.partial(
                stored_resize_matrix, self.store, interpolation=self.interpolation
            )
        rows = made(n_in=height, n_out=self.size[0], antialias=self.antialias)
        cols = made(n_in=width, n_out=self.size[1], antialias=self.antialias)
        return rows, cols

    def _affine(self):
        # (x * scale - mean) / std == x * gain + offset, per channel
        std = np.asarray(self.std, dtype=np.float64)
        gain = (self.scale / std).astype(np.float32).reshape(1, 3, 1, 1)
        offset = (
            (-np.asarray(self.mean, dtype=np.float64) / std).astype(np.float32).reshape(1, 3, 1, 1)
        )
        return gain, offset

    def uses_matrices(self, height: int, width: int) -> bool:
        """Whether an input of this size is resized by matrix products (else by F.interpolate)."""
        return max(height, width) <= MATRIX_MAX_SIDE

    def numpy(self, images: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 NHWC -> float32 NCHW ``(N, 3, *size)``, C-contiguous, on the CPU.

        ``out``: an optional float32 C-contiguous array of that shape to write into
        (an extractor reuses one across batches: large fresh arrays cost page faults).
        """
        images = check_images(images)
        n, height, width, channels = images.shape
        shape = (n, 3, *self.size)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif out.shape != shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous float32 array of shape {shape}")
        x = images.transpose(0, 3, 1, 2).astype(np.float32)  # N, C, H, W
        if (height, width) == tuple(self.size):
            resized = x
        elif self.uses_matrices(height, width):
            rows, cols = self._matrices(height, width)
            # Small GEMMs on one BLAS thread: OpenBLAS's threads spin after a call and
            # took a third of the CPU from the network's own threads (bench_extract.py).
            with blas_libraries().limit(limits=1, user_api="blas"):
                x = np.matmul(rows, x)  # N, C, h, W
                # one GEMM for the second axis (np.matmul broadcasting a transposed operand
                # can be far slower); RGB goes straight into `out`
                resized = out if channels == 3 else np.empty((n, 1, *self.size), np.float32)
                np.matmul(
                    x.reshape(-1, width),
                    np.ascontiguousarray(cols.T),
                    out=resized.reshape(-1, self.size[1]),
                )
        else:
            import torch

            resized = self._interpolate(torch.from_numpy(x)).numpy()
        if self.round_to_uint8 and resized is not x:
            np.add(resized, 0.5, out=resized)
            np.floor(resized, out=resized)
            np.clip(resized, 0, 255, out=resized)
        gain, offset = self._affine()
        for c in range(3):  # a grayscale channel fills all three
            np.multiply(resized[:, c if channels == 3 else 0], gain[0, c, 0, 0], out=out[:, c])
            out[:, c] += offset[0, c, 0, 0]
        return out

    def torch(self, images: np.ndarray | torch.Tensor, device: torch.device | str) -> torch.Tensor:
        """Same as :meth:`numpy` with torch ops on ``device`` (uint8 crosses the bus, not float32)."""
        import torch

        if isinstance(images, np.ndarray):
            images = torch.from_numpy(np.ascontiguousarray(check_images(images)))
        x = images.to(device, non_blocking=True).permute(0, 3, 1, 2).to(torch.float32)
        n, _, height, width = x.shape
        if (height, width) != tuple(self.size):
            if self.uses_matrices(height, width):
                rows, cols = (
                    torch.from_numpy(m).to(x.device) for m in self._matrices(height, width)
                )
                x = ((rows @ x).reshape(-1, width) @ cols.T).reshape(n, -1, *self.size)
            else:
                x = self._interpolate(x)
            if self.round_to_uint8:
                x = torch.floor(x + 0.5).clamp_(0, 255)
        gain, offset = (torch.from_numpy(a).to(x.device) for a in self._affine())
        return torch.addcmul(offset, x, gain).contiguous()

    def _interpolate(self, x: torch.Tensor) -> torch.Tensor:
        return interpolate(x, self.size, self.interpolation, self.antialias)

    def __call__(self, images: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
        """uint8 NHWC numpy batch -> normalised float32 NCHW tensor on ``device``."""
        import torch

        if torch.device(device).type == "cpu":
            return torch.from_numpy(self.numpy(images))
        return self.torch(images, device)


@functools.lru_cache(maxsize=64)
def stored_resize_matrix(
    folder: Path, n_in: int, n_out: int, interpolation: str, antialias: bool
) -> np.ndarray:
    """:func:`resize_matrix`, read from ``folder`` where an earlier process kept it (no torch
    import), else made and kept there (``resize-<interpolation>[-aa]-<n_in>to<n_out>-torch
    <version>.npy``, written atomically; made in a child process where this one has not
    imported torch: :mod:`distrank.features.torch_child`); a file of the wrong shape or
    type is made again."""
    from distrank._io import atomic_open, atomic_path

    from .onnx_backend import torch_version

    aa = "-aa" if antialias else ""
    tag = torch_version().replace("+", "_")
    path = Path(folder) / f"resize-{interpolation}{aa}-{n_in}to{n_out}-torch{tag}.npy"
    try:
        kept = np.load(path, allow_pickle=False)
        if kept.shape == (n_out, n_in) and kept.dtype == np.float32:
            return kept
    except (OSError, ValueError):
        pass
    if "torch" not in sys.modules:  # a child process imports torch instead of this one
        from .torch_child import run

        with atomic_path(path) as tmp:
            args = {"n_in": n_in, "n_out": n_out, "interpolation": interpolation}
            run(f"{__name__}:save_resize_matrix", **args, antialias=antialias, out=str(tmp))
            return np.load(tmp, allow_pickle=False)
    made = resize_matrix(n_in, n_out, interpolation, antialias)
    with atomic_open(path) as f:
        np.save(f, made)
    return made


def save_resize_matrix(out: str, **kwargs) -> None:
    """The child process's :func:`resize_matrix` (:mod:`distrank.features.torch_child`),
    saved to ``out``."""
    np.save(out, resize_matrix(**kwargs))
