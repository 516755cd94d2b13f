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

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from distrank.experiments import Outputs, collected, per_model, zoo_scores
from distrank.metrics.registry import PRDC, display
from distrank.report.figures import metric_label, new_figure, paper_style

__all__ = ["PRDC", "e6_table", "e6_figure", "run"]

TABLES = ("", "_agreement")


scores = zoo_scores


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    table, agreement = e6_table(collected(inputs, context))
    return Outputs(
        {"": table, "_agreement": agreement}, {"": e6_figure(table, context["extractor"])}
    )


def e6_table(
    scores: pd.DataFrame, metrics: Sequence[str] = PRDC
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-model PRDC in both aggregations, and per-metric rank agreement.

    Returns
    -------
    per_model : :func:`distrank.experiments.per_model` with ``<M>_absdiff``
        (:math:`|all - avg|`), sorted by model name.
    agreement : per metric ``kendall_tau`` (avg vs all), ``p_value``, ``n_models``,
        ``rank_flips``, ``max_absdiff`` (largest :math:`|all - avg|` over models).
    """
    table, agreement = per_model(scores, metrics, difference="absdiff")
    agreement["max_absdiff"] = [float(table[f"{display(m)}_absdiff"].max()) for m in metrics]
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
            name = display(metric)
            x = table[f"{name}_all"].to_numpy(float)
            y = table[f"{name}_avg"].to_numpy(float)
            lo, hi = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
            pad = 0.08 * (hi - lo if hi > lo else 1.0)
            lims = (lo - pad, hi + pad)
            ax.plot(lims, lims, color="0.5", lw=0.8, ls="--", zorder=1, label="avg = all")
            ax.scatter(
                x,
                y,
                s=16,
                color="tab:blue",
                edgecolor="white",
                linewidth=0.4,
                zorder=3,
                label=f"model ({len(x)})",
            )
            ax.set_xlim(lims)
            ax.set_ylim(lims)
            ax.set_xlabel(metric_label(metric, extractor, "all"))
            ax.set_ylabel(metric_label(metric, extractor, "avg"))
            ax.set_title(
                f"({letter}) {name}: max |all - avg| = {np.max(np.abs(x - y)):.2g}", loc="left"
            )
            ax.legend(loc="best")  # points may sit anywhere off the diagonal
    return fig
