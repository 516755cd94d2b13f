"""Verdicts on a score table: may a metric's clients' average stand in for its pooled value?

One function per concern: :func:`verdict` (what theory says, from the metric and the
options), :func:`gap_is_constant` (whether KD's measured gap is Theorem 1's constant),
:func:`rounding_level` (below which a difference of scores is float rounding), and
:func:`consistency`, which applies them to every metric of a table. The page of
:mod:`distrank.report.html` renders what they return.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from distrank.metrics.ranking import discordant_pairs
from distrank.metrics.registry import METRICS
from distrank.metrics.table import kendall_tau, per_metric

__all__ = [
    "COLUMNS",
    "GAP_RTOL",
    "ROUNDING_ULPS",
    "WHY_NOT",
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

#: Why a metric's average need not rank like its pooled value (the registry records
#: why KD and Recall do).
WHY_NOT = {
    "fd": "Theorem 2 and Proposition 1: FD_avg - FD_all depends on the model's mean and "
    "covariance; FD_avg is minimised by the clients' Wasserstein barycenter, FD_all "
    "by the pooled Gaussian, so two models can swap order.",
    "precision": "Precision counts generated samples inside the reference manifold, whose "
    "k-NN radii differ between each client and the pool.",
    "density": "Density counts generated samples in reference k-NN balls, whose radii "
    "differ between each client and the pool.",
    "coverage": "Coverage uses the k-NN radii of the reference rows, which differ between "
    "each client and the pool.",
}

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
    weights, estimator = options.get("weights"), options.get("kd_estimator")
    rows = []
    for metric, wide in per_metric(scores).items():
        all_, avg = wide["all"].to_numpy(float), wide["avg"].to_numpy(float)
        gap = avg - all_
        gap_mean, gap_range = float(gap.mean()), float(np.ptp(gap))
        rows.append(
            (
                metric,
                *verdict(metric, weights, estimator),
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


def verdict(metric: str, weights: str | None, estimator: str | None) -> tuple[str, str]:
    """``("safe" | "exact" | "not guaranteed", why)`` for ``metric`` scored with client
    ``weights`` (``"size"``, ``"uniform"``; None: not recorded) and KD ``estimator``.

    KD is safe with weights n_i/n and a full-sample estimator (Theorem 1: the gap is
    the same for every model); Recall is exact with weights n_i/n; the rest are not
    guaranteed (:data:`WHY_NOT`).
    """
    reason = METRICS[metric].consistent if metric in METRICS else ""
    assumed = "" if weights else " (options not recorded: assuming weights n_i/n)"
    if metric == "kd":
        if weights == "uniform":
            return "not guaranteed", (
                "Theorem 1 needs weights n_i/n; with uniform weights the "
                "gap KD_avg - KD_all depends on the model"
            )
        if estimator == "subsets":
            return "not guaranteed", (
                "KID-style random subsets: Theorem 1 holds in expectation "
                "only; use the unbiased or biased estimator"
            )
        return "safe", reason + assumed
    if metric == "recall":
        if weights == "uniform":
            return "not guaranteed", "Recall_all = sum_i (n_i/n) Recall_i needs weights n_i/n"
        return "exact", reason + assumed
    return "not guaranteed", reason or WHY_NOT.get(metric, "no identity links avg to all")


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
