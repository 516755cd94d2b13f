"""Experiments: score tables in, result tables (and figures) out.

Each experiment module (``e1``, ``e2``, ``e3``, ``e6``) is a set of pure functions
on pandas DataFrames and numpy arrays; the Snakemake scripts do the file I/O. This
package module holds the helpers they share: turning a tidy score table (columns
``model, metric, aggregation, client, value``; ``aggregation`` in
``{"all", "avg", "client"}``) into one row per model, ranking models, and
measuring how well the ``avg`` ranking agrees with the ``all`` ranking.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np
import pandas as pd
from scipy import stats

from distrank.report.figures import METRIC_NAMES

__all__ = [
    "SCORE_COLUMNS",
    "HIGHER_IS_BETTER",
    "METRIC_COLUMN_NAMES",
    "check_scores",
    "aggregates_wide",
    "rank_models",
    "discordant_pairs",
    "rank_agreement",
]

SCORE_COLUMNS = ("model", "metric", "aggregation", "client", "value")

#: Direction of each metric: distances are better when low, PRDC when high.
HIGHER_IS_BETTER = {
    "kd": False,
    "fd": False,
    "precision": True,
    "recall": True,
    "density": True,
    "coverage": True,
}

#: Prefix of a metric's columns in result tables (``KD_all``, ``Recall_avg``, ...).
METRIC_COLUMN_NAMES = METRIC_NAMES


def check_scores(scores: pd.DataFrame, metrics: Sequence[str] = ()) -> None:
    """Raise ``ValueError`` unless ``scores`` is a tidy score table holding ``metrics``."""
    if not isinstance(scores, pd.DataFrame):
        raise TypeError(f"scores must be a pandas DataFrame, got {type(scores).__name__}")
    missing = [c for c in SCORE_COLUMNS if c not in scores.columns]
    if missing:
        raise ValueError(f"scores lacks columns {missing}; expected {list(SCORE_COLUMNS)}")
    absent = sorted(set(metrics) - set(scores["metric"]))
    if absent:
        raise ValueError(f"scores has no rows for metric(s) {absent}; it has {sorted(set(scores['metric']))}")


def aggregates_wide(scores: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """One row per model, columns ``<Metric>_all`` and ``<Metric>_avg``.

    Rows are sorted by model name. Raises if a (model, metric, aggregation) has no
    value or more than one.
    """
    check_scores(scores, metrics)
    agg = scores[scores["aggregation"].isin(["all", "avg"]) & scores["metric"].isin(metrics)]
    counts = agg.groupby(["model", "metric", "aggregation"]).size()
    if (counts > 1).any():
        raise ValueError(f"duplicate score rows: {counts[counts > 1].index.tolist()}")
    wide = agg.pivot(index="model", columns=["metric", "aggregation"], values="value")
    columns = [(m, a) for m in metrics for a in ("all", "avg")]
    lacking = [c for c in columns if c not in wide.columns]
    if lacking:
        raise ValueError(f"scores lack (metric, aggregation) {lacking}")
    wide = wide[columns]
    if wide.isna().any().any():
        holes = wide[wide.isna().any(axis=1)].index.tolist()
        raise ValueError(f"models {holes} lack an all or avg score")
    wide.columns = [f"{METRIC_COLUMN_NAMES.get(m, m)}_{a}" for m, a in columns]
    wide = wide.sort_index().reset_index()
    wide.columns.name = None
    return wide


def rank_models(values: pd.Series | np.ndarray, *, higher_is_better: bool) -> np.ndarray:
    """Rank 1 = best; ties share the lowest rank (``"min"`` method), as integers."""
    series = pd.Series(np.asarray(values, dtype=float))
    return series.rank(ascending=not higher_is_better, method="min").astype(int).to_numpy()


def discordant_pairs(all_values: Sequence[float], avg_values: Sequence[float]) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, that ``all`` and ``avg`` order oppositely.

    A pair tied in one aggregation but not the other is not counted (Kendall's
    tau-b treats it as neither concordant nor discordant).
    """
    a = np.asarray(all_values, dtype=float)
    b = np.asarray(avg_values, dtype=float)
    return [(i, j) for i, j in combinations(range(len(a)), 2) if np.sign(a[i] - a[j]) * np.sign(b[i] - b[j]) < 0]


def rank_agreement(wide: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """Kendall tau-b between the ``avg`` and ``all`` scores of the models, per metric.

    Columns: ``metric`` (display name), ``kendall_tau``, ``p_value``
    (:func:`scipy.stats.kendalltau`; NaN with fewer than two models or a constant
    column), ``n_models``, ``rank_flips`` (number of discordant model pairs).
    """
    rows = []
    for metric in metrics:
        name = METRIC_COLUMN_NAMES.get(metric, metric)
        all_v, avg_v = wide[f"{name}_all"].to_numpy(float), wide[f"{name}_avg"].to_numpy(float)
        if len(all_v) >= 2:
            result = stats.kendalltau(avg_v, all_v)
            tau, p = float(result.statistic), float(result.pvalue)
        else:
            tau, p = float("nan"), float("nan")
        rows.append(
            {
                "metric": name,
                "kendall_tau": tau,
                "p_value": p,
                "n_models": len(all_v),
                "rank_flips": len(discordant_pairs(all_v, avg_v)),
            }
        )
    return pd.DataFrame(rows, columns=["metric", "kendall_tau", "p_value", "n_models", "rank_flips"])
