"""Array helpers shared by the metrics: input checks, dtypes, devices.

Every metric takes numpy or torch arrays and computes with torch, on the CPU or a
CUDA device through the same code path. Inputs are checked here, at the boundary,
with messages that name the argument and the problem.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from distrank._checks import positive_int  # noqa: F401  (re-exported)

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def work_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of the products: ``"float32"`` or ``"float64"``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def resolve_device(device=None) -> torch.device:
    """``device`` as a torch device; ``None`` means CUDA when available, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device: not a torch device: {device!r} ({err})") from None


def as_features(x, name: str) -> torch.Tensor:
    """``x`` as a 2-d, non-empty, real, finite tensor (no copy for contiguous numpy
    input; a tensor is detached)."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
    else:
        x = np.asarray(x)
        if x.dtype.kind not in "biuf":
            raise ValueError(f"{name}: expected numeric features, got dtype {x.dtype}")
        with warnings.catch_warnings():  # read-only inputs are fine: nothing writes to them
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            x = torch.from_numpy(np.ascontiguousarray(x))
    if x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{name}: expected real features, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-d (rows, d) array, got shape {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name}: empty array of shape {tuple(x.shape)}")
    if x.is_floating_point() and not _all_finite(x):
        raise ValueError(f"{name}: contains NaN or infinite values")
    return x


# Entries of one row block of the whole-array passes below (16 MiB of float32): a
# whole-array ``isfinite`` or float64 ``mean`` would hold several times the array.
_ELEMENTS = 2**22


def _row_blocks(x: torch.Tensor, elements: int):
    step = max(1, elements // x.shape[1])
    return (x[r : r + step] for r in range(0, x.shape[0], step))


def _all_finite(x: torch.Tensor, elements: int = _ELEMENTS) -> bool:
    """Whether every entry is finite, checked one row block at a time."""
    return all(bool(torch.isfinite(b).all()) for b in _row_blocks(x, elements))


def column_mean(x: torch.Tensor, elements: int = _ELEMENTS) -> torch.Tensor:
    """The mean of the rows of ``x`` in float64, summed one row block at a time."""
    return sum(b.sum(dim=0, dtype=torch.float64) for b in _row_blocks(x, elements)) / x.shape[0]
