r"""E1: KD ranks models the same centrally and averaged over clients; FD need not.

Theorem 1 (KD = squared MMD, any fixed kernel, weights :math:`\lambda_i = n_i/n`):

.. math::
    \mathrm{KD}_\mathrm{avg}(G) = \mathrm{KD}_\mathrm{all}(G)
        + \sum_i \lambda_i \, \mathrm{KD}(\bar P, P_i),

and the offset does not depend on the model :math:`G`, so the gap
:math:`\mathrm{KD}_\mathrm{avg} - \mathrm{KD}_\mathrm{all}` is the same for every
model and both aggregations rank the zoo identically (Kendall tau = 1). FD has no
such identity (Theorem 2): its gap varies across models and model pairs can swap
order ("rank flips").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from distrank.experiments import Outputs, collected, discordant_pairs, per_model, zoo_scores
from distrank.metrics.registry import display
from distrank.report.figures import metric_label, metric_name, new_figure, paper_style

__all__ = ["e1_table", "e1_figure", "run"]

TABLES = ("", "_agreement")


scores = zoo_scores


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    table, agreement = e1_table(collected(inputs, context))
    return Outputs(
        {"": table, "_agreement": agreement}, {"": e1_figure(table, context["extractor"])}
    )


def e1_table(
    scores: pd.DataFrame, metrics: Sequence[str] = ("kd", "fd")
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-model aggregates and per-metric rank agreement for E1.

    Parameters
    ----------
    scores : tidy score table (``model, metric, aggregation, client, value``) with
        ``all`` and ``avg`` rows for every model and metric.
    metrics : metric keys to tabulate, distances first (``"kd"``, ``"fd"``).

    Returns
    -------
    per_model : :func:`distrank.experiments.per_model` with ``<M>_gap`` (``avg - all``),
        sorted by the first metric's ``all`` rank (best first).
    agreement : per metric ``kendall_tau`` (tau-b of avg vs all), ``p_value``,
        ``n_models``, ``rank_flips`` (discordant model pairs).
    """
    table, agreement = per_model(scores, metrics, difference="gap")
    first = display(metrics[0])
    table = table.sort_values([f"{first}_all_rank", "model"], kind="mergesort").reset_index(
        drop=True
    )
    return table, agreement


def _slope_one_fit(ax, x: np.ndarray, y: np.ndarray, unit: str) -> float:
    """Least-squares line of slope 1 (intercept = mean gap); returns the gap."""
    gap = float(np.mean(y - x))
    lo, hi = float(np.min(x)), float(np.max(x))
    pad = 0.05 * (hi - lo if hi > lo else abs(hi) or 1.0)
    xs = np.array([lo - pad, hi + pad])
    spread = float(np.ptp(y - x))
    ax.plot(
        xs,
        xs + gap,
        color="0.45",
        lw=0.9,
        ls="--",
        zorder=1,
        label=f"slope 1, mean {unit} gap {gap:.3g}\n(max - min gap {spread:.2g})",
    )
    return gap


def e1_figure(table: pd.DataFrame, extractor: str, *, kd: str = "kd", fd: str = "fd") -> Figure:
    """Two panels, double column: KD_avg vs KD_all, FD_avg vs FD_all.

    Left: the models lie on a line of slope 1 (the fitted line's intercept is the
    mean gap; "gap range" is max - min of the gaps, zero up to rounding for KD).
    Right: the same for FD, with every pair of models that FD_avg and FD_all order
    differently joined by a red line (rank flip).

    ``table`` is the ``per_model`` output of :func:`e1_table`; ``extractor`` names
    the feature network for the axis labels (e.g. ``"EfficientNet-Lite0"``).
    """
    with paper_style():
        fig, axes = new_figure(1, 2, width="double", height=2.9)
        for ax, metric, flips in ((axes[0, 0], kd, False), (axes[0, 1], fd, True)):
            name = display(metric)
            x = table[f"{name}_all"].to_numpy(float)
            y = table[f"{name}_avg"].to_numpy(float)
            _slope_one_fit(ax, x, y, metric_name(metric, extractor))
            if flips:
                pairs = discordant_pairs(x, y)
                for k, (i, j) in enumerate(pairs):
                    ax.plot(
                        [x[i], x[j]],
                        [y[i], y[j]],
                        color="tab:red",
                        lw=0.8,
                        alpha=0.8,
                        zorder=2,
                        label=f"rank flip ({len(pairs)} pairs)" if k == 0 else None,
                    )
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
            ax.set_xlabel(metric_label(metric, extractor, "all"))
            ax.set_ylabel(metric_label(metric, extractor, "avg"))
            ax.legend(loc="upper left")
        axes[0, 0].set_title("(a) Kernel distance", loc="left")
        axes[0, 1].set_title("(b) Fréchet distance", loc="left")
    return fig
