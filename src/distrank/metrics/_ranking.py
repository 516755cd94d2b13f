"""Rankings of models by a score: ranks, and the pairs that two scorings order oppositely.

Torch-free (numpy and pandas), so the experiments, the figures and the report can use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np
import pandas as pd

__all__ = ["rank_models", "discordant_pairs", "tau_b"]


def rank_models(values: pd.Series | np.ndarray, *, higher_is_better: bool) -> np.ndarray:
    """Rank 1 = best; ties share the lowest rank (``"min"`` method), as integers."""
    series = pd.Series(np.asarray(values, dtype=float))
    return series.rank(ascending=not higher_is_better, method="min").astype(int).to_numpy()


def discordant_pairs(
    all_values: Sequence[float], avg_values: Sequence[float]
) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, that ``all`` and ``avg`` order oppositely.

    A pair tied in one aggregation but not the other is not counted (Kendall's
    tau-b treats it as neither concordant nor discordant).
    """
    a = np.asarray(all_values, dtype=float)
    b = np.asarray(avg_values, dtype=float)
    return [
        (i, j)
        for i, j in combinations(range(len(a)), 2)
        if np.sign(a[i] - a[j]) * np.sign(b[i] - b[j]) < 0
    ]


def tau_b(x, y) -> float | np.ndarray:
    """Kendall's tau-b of ``x`` and ``y``, the value of ``scipy.stats.kendalltau(x, y)``
    to the last bit, over the last axis (batches of rankings at once; no scipy.stats).

    (C - D) / sqrt(P - T_x) / sqrt(P - T_y) over the P pairs (C concordant, D
    discordant, T_x tied in x), in scipy's order of operations, clipped to [-1, 1];
    NaN for fewer than two values, a constant x or y, or a NaN.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"x, y: shapes {x.shape} and {y.shape} differ")
    if x.shape[-1] < 2:
        return np.full(x.shape[:-1], np.nan)[()]
    upper = np.triu_indices(x.shape[-1], k=1)
    sx = np.sign(x[..., :, None] - x[..., None, :])[..., upper[0], upper[1]]
    sy = np.sign(y[..., :, None] - y[..., None, :])[..., upper[0], upper[1]]
    pairs = sx.shape[-1]
    tied_x, tied_y = pairs - np.count_nonzero(sx, axis=-1), pairs - np.count_nonzero(sy, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = (sx * sy).sum(axis=-1) / np.sqrt(pairs - tied_x) / np.sqrt(pairs - tied_y)
    undefined = (tied_x == pairs) | (tied_y == pairs) | np.isnan(x).any(-1) | np.isnan(y).any(-1)
    return np.where(undefined, np.nan, np.clip(tau, -1.0, 1.0))[()]
