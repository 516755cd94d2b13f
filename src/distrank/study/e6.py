r"""E6: precision, recall, density and coverage, centrally (all) vs averaged (avg).

Recall (Kynkäänniemi et al. 2019) is the fraction of *reference* points inside the
generated manifold (union of k-NN balls of the generated samples). That manifold
does not depend on the clients, so each reference point counts the same either way
and :math:`\mathrm{Recall}_\mathrm{all} = \sum_i (n_i/n) \mathrm{Recall}_i` exactly.
Precision and density count *generated* points inside the reference manifold and
coverage uses reference k-NN radii; the pooled reference has different neighbours
than each client's, so these need not agree (paper, Sec. "other metrics").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from distrank.report.figures import metric_label, new_figure, paper_style
from distrank.study import HIGHER_IS_BETTER, METRIC_COLUMN_NAMES, aggregates_wide, rank_agreement, rank_models

__all__ = ["PRDC", "e6_table", "e6_figure"]

PRDC = ("precision", "recall", "density", "coverage")


def e6_table(scores: pd.DataFrame, metrics: Sequence[str] = PRDC) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-model PRDC in both aggregations, and per-metric rank agreement.

    Returns
    -------
    per_model : one row per model (sorted by name): per metric ``<M>_all``,
        ``<M>_avg``, ``<M>_absdiff`` (:math:`|all - avg|`), then ``<M>_all_rank`` and
        ``<M>_avg_rank`` (1 = best = highest).
    agreement : per metric ``kendall_tau`` (avg vs all), ``p_value``, ``n_models``,
        ``rank_flips``, ``max_absdiff`` (largest :math:`|all - avg|` over models).
    """
    wide = aggregates_wide(scores, metrics)
    names = [METRIC_COLUMN_NAMES.get(m, m) for m in metrics]
    table = wide[["model"]].copy()
    for name in names:
        table[f"{name}_all"] = wide[f"{name}_all"]
        table[f"{name}_avg"] = wide[f"{name}_avg"]
        table[f"{name}_absdiff"] = (wide[f"{name}_all"] - wide[f"{name}_avg"]).abs()
    for metric, name in zip(metrics, names):
        for agg in ("all", "avg"):
            table[f"{name}_{agg}_rank"] = rank_models(
                wide[f"{name}_{agg}"], higher_is_better=HIGHER_IS_BETTER.get(metric, True)
            )
    agreement = rank_agreement(wide, metrics)
    agreement["max_absdiff"] = [float(table[f"{name}_absdiff"].max()) for name in names]
    return table, agreement


def e6_figure(table: pd.DataFrame, extractor: str, metrics: Sequence[str] = PRDC) -> Figure:
    """2 x 2 scatter, one panel per metric: avg (y) against all (x), one point per
    model, with the diagonal y = x (where Recall's points lie exactly); both axes of
    a panel share their limits. Panels do not share scales (density is not bounded
    by one). ``table`` is ``per_model`` of
    :func:`e6_table`."""
    if len(metrics) != 4:
        raise ValueError(f"e6_figure draws four panels, got metrics {list(metrics)}")
    with paper_style():
        fig, axes = new_figure(2, 2, width="double", height=5.4)
        for letter, ax, metric in zip("abcd", axes.flat, metrics):
            name = METRIC_COLUMN_NAMES.get(metric, metric)
            x = table[f"{name}_all"].to_numpy(float)
            y = table[f"{name}_avg"].to_numpy(float)
            lo, hi = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
            pad = 0.08 * (hi - lo if hi > lo else 1.0)
            lims = (lo - pad, hi + pad)
            ax.plot(lims, lims, color="0.5", lw=0.8, ls="--", zorder=1, label="avg = all")
            ax.scatter(x, y, s=16, color="tab:blue", edgecolor="white", linewidth=0.4, zorder=3,
                       label=f"model ({len(x)})")
            ax.set_xlim(lims)
            ax.set_ylim(lims)
            ax.set_xlabel(metric_label(metric, extractor, "all"))
            ax.set_ylabel(metric_label(metric, extractor, "avg"))
            ax.set_title(f"({letter}) {name}: max |all - avg| = {np.max(np.abs(x - y)):.2g}", loc="left")
            ax.legend(loc="best")  # points may sit anywhere off the diagonal
    return fig
