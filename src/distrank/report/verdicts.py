"""Verdicts on a score table: may a metric's clients' average stand in for its pooled value?

One function per concern: :func:`verdict` (what theory says: the metric's own
``Metric.verdict``), :func:`gap_is_constant` (whether KD's measured gap is Theorem 1's
constant), :func:`rounding_level` (below which a difference of scores is float rounding),
and :func:`consistency`, which applies them to every metric of a table. The page of
:mod:`distrank.report.html` renders what they return.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from distrank.metrics._metric import NOT_GUARANTEED
from distrank.metrics._ranking import discordant_pairs
from distrank.metrics._registry import METRICS
from distrank.metrics._table import kendall_tau, per_metric

__all__ = [
    "COLUMNS",
    "GAP_RTOL",
    "ROUNDING_ULPS",
    "consistency",
    "gap_is_constant",
    "rounding_level",
    "verdict",
]

#: Relative spread of the KD gap (max - min over models, over the mean gap) below
#: which it is reported as constant: float32 products leave about 1e-7.
GAP_RTOL = 1e-4

#: A difference of scores at most this many units in the last place (the machine epsilon
#: of the scores' dtype) of the largest score it is taken from is float rounding. The
#: scorer sums in float64 whatever its ``dtype``; on identities (KD's constant gap,
#: Recall_all = sum_i (n_i/n) Recall_i) what is left is measured at 0.5 to 16 ulp, more
#: where KD cancels kernel means far larger than itself. 2^12 ulp (9.1e-13 relative in
#: float64) leaves that room and is still far below what the scores resolve (float32
#: products, the default, about 1e-7 relative).
ROUNDING_ULPS = 2**12

#: The columns of :func:`consistency`'s table.
COLUMNS = (
    "metric",
    "verdict",
    "why",
    "gap_mean",
    "gap_range",
    "gap_constant",
    "max_absdiff",
    "rounding",
    "rank_flips",
    "kendall_tau",
    "n_models",
)


def consistency(scores: pd.DataFrame, meta: Mapping | None = None) -> pd.DataFrame:
    """Per metric: may its ``avg`` stand in for ``all``? One row per metric with both.

    Columns: ``metric`` (key), ``verdict`` and ``why`` (:func:`verdict`),
    ``gap_mean`` and ``gap_range`` (mean and max - min over models of avg - all),
    ``gap_constant`` (:func:`gap_is_constant`), ``max_absdiff`` (max ``|avg - all|``),
    ``rounding`` (:func:`rounding_level` of the metric's all and avg values),
    ``rank_flips`` (model pairs ordered differently), ``kendall_tau`` (tau-b of avg vs
    all; NaN for fewer than two models or ties), ``n_models``.

    Unknown options (no ``meta``) are taken as the defaults of ``distrank score``
    (size weights, unbiased KD), and ``why`` says so.
    """
    options = dict((meta or {}).get("options") or {})
    rows = []
    for metric, wide in per_metric(scores).items():
        all_, avg = wide["all"].to_numpy(float), wide["avg"].to_numpy(float)
        gap = avg - all_
        gap_mean, gap_range = float(gap.mean()), float(np.ptp(gap))
        rows.append(
            (
                metric,
                *verdict(metric, options),
                gap_mean,
                gap_range,
                gap_is_constant(gap_mean, gap_range),
                float(np.abs(gap).max()),
                rounding_level(np.concatenate([all_, avg])),
                len(discordant_pairs(all_, avg)),
                kendall_tau(all_, avg)[0],
                len(wide),
            )
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def verdict(metric: str, options: Mapping | None = None) -> tuple[str, str]:
    """``("safe" | "exact" | "not guaranteed", why)`` for ``metric`` scored with
    ``options`` (option names; unrecorded ones taken as ``distrank score``'s defaults):
    the metric's own (``Metric.verdict``); a metric the package does not know has none."""
    if metric not in METRICS:
        return NOT_GUARANTEED, "no identity links avg to all"
    return METRICS[metric].verdict(options)


def gap_is_constant(gap_mean: float, gap_range: float) -> bool:
    """Whether the gaps avg - all of the models are one constant: their range at most
    :data:`GAP_RTOL` of their mean."""
    return gap_range <= GAP_RTOL * max(abs(gap_mean), np.finfo(float).tiny)


def rounding_level(values: np.ndarray) -> float:
    """The largest difference of ``values`` that is float rounding: :data:`ROUNDING_ULPS`
    times the machine epsilon of their dtype times their largest magnitude (0 when all
    are 0 or none is finite)."""
    values = np.asarray(values)
    values = values if values.dtype.kind == "f" else values.astype(float)
    finite = np.abs(values[np.isfinite(values)])
    scale = float(finite.max()) if finite.size else 0.0
    return ROUNDING_ULPS * float(np.finfo(values.dtype).eps) * scale
