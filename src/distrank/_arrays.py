"""Array helpers shared by the metrics: input checks, dtypes, devices.

Every metric takes numpy or torch arrays and computes with torch, on the CPU or a
CUDA device through the same code path. Inputs are checked here, at the boundary,
with messages that name the argument and the problem.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
import torch

from distrank._checks import about, positive_int

DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: Entries of one product block (64 MiB of float32): the default block of KD's and
#: PRDC's passes (:func:`product_rows`).
BLOCK_ELEMENTS = 2**24


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


def check_models(models, d: int) -> dict[str, torch.Tensor]:
    """The models' rows (name -> (m, d) tensor), each checked and named by its key."""
    if not isinstance(models, Mapping) or not models:
        raise ValueError("models: expected a non-empty mapping of name -> (m, d) array")
    ys = {}
    for name, y in models.items():
        with about("model", str(name)):
            y = as_features(y, f"models[{name!r}]")
            if y.shape[1] != d:
                raise ValueError(
                    f"models[{name!r}]: dimension {y.shape[1]} does not match "
                    f"the reference dimension {d}"
                )
        ys[str(name)] = y
    if len(ys) != len(models):
        raise ValueError("models: names are not distinct as strings")
    return ys


def product_rows(block_size, itemsize: int, name: str = "block_size") -> int:
    """Rows of one product block: ``block_size``, or for None square blocks of
    :data:`BLOCK_ELEMENTS` entries (4,096 rows in float32, 2,816 in float64)."""
    if block_size is None:
        return int(np.sqrt(BLOCK_ELEMENTS * 4 // itemsize)) // 256 * 256
    return positive_int(block_size, name)


# Entries of one row block of the whole-array passes below (16 MiB of float32): a
# whole-array ``isfinite`` or float64 ``mean`` would hold several times the array.
_ELEMENTS = 2**22


def _row_blocks(x: torch.Tensor, elements: int):
    step = max(1, elements // x.shape[1])
    return (x[r : r + step] for r in range(0, x.shape[0], step))


def _all_finite(x: torch.Tensor, elements: int = _ELEMENTS) -> bool:
    """Whether every entry is finite, checked one row block at a time: a block whose sum
    is finite holds no NaN or infinity (either makes the sum one); only a block whose sum
    is not (it may be finite entries that overflow) is checked entry by entry, which
    costs 20 times the sum."""
    return all(
        bool(torch.isfinite(b.sum())) or bool(torch.isfinite(b).all())
        for b in _row_blocks(x, elements)
    )


def column_mean(x: torch.Tensor, elements: int = _ELEMENTS) -> torch.Tensor:
    """The mean of the rows of ``x`` in float64, summed one row block at a time."""
    return sum(b.sum(dim=0, dtype=torch.float64) for b in _row_blocks(x, elements)) / x.shape[0]
