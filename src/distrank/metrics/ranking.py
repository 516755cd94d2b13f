"""Rankings of models by a score: ranks, and the pairs that two scorings order oppositely.

Torch-free (numpy and pandas), so the experiments, the figures and the report can use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np
import pandas as pd

__all__ = ["rank_models", "discordant_pairs"]


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
