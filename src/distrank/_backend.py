"""Array helpers shared by the metrics: input checks, dtypes, devices, client groups.

Every metric takes numpy or torch arrays and computes with torch, on the CPU or a
CUDA device through the same code path. Inputs are checked here, at the boundary,
with messages that name the argument and the problem.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from distrank._checks import positive_int  # noqa: F401  (re-exported)
from distrank.clients import client_weights
from distrank.metrics.registry import check_metrics  # noqa: F401  (re-exported)

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
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name}: contains NaN or infinite values")
    return x


@dataclass(frozen=True)
class ClientGroups:
    """The clients of a reference set: sorted labels, each row's client, sizes.

    ``names[c]`` is ``str`` of the c-th sorted distinct label (the same names the
    PRDC results use); ``index[j]`` is the client of reference row j.
    """

    names: list[str]
    index: np.ndarray  # (n,) int64, client of each row
    sizes: np.ndarray  # (k,) int64, rows per client

    def weights(self, scheme: str) -> np.ndarray:
        """lambda_i of :func:`distrank.clients.client_weights`."""
        return client_weights(self.sizes, scheme)

    def rows(self, c: int) -> np.ndarray:
        """Indices of the reference rows of client c."""
        return np.flatnonzero(self.index == c)


def client_groups(clients, n: int) -> ClientGroups:
    """Group ``n`` reference rows by their client labels (int or str)."""
    if isinstance(clients, torch.Tensor):
        clients = clients.detach().cpu().numpy()
    labels = np.asarray(clients)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(
            f"clients: expected {n} labels (one per reference row), got shape {labels.shape}"
        )
    if labels.dtype.kind not in "iuU":
        raise ValueError(f"clients: expected int or str labels, got dtype {labels.dtype}")
    unique, index, sizes = np.unique(labels, return_inverse=True, return_counts=True)
    names = [str(u) for u in unique.tolist()]
    if len(set(names)) != len(names):
        raise ValueError(f"clients: labels are not distinct as strings: {names}")
    return ClientGroups(names, index.astype(np.int64), sizes.astype(np.int64))
