r"""A5, tightness of the constant 4 in the stacking bound
:math:`\mathbb E[D] \le 4(\bar R_k - \bar R_{2k})`.

Construction (Eaton et al., arXiv:2602.23360): target :math:`y = e_0`, base models
:math:`g_i = e_0 + \sigma e_i` for orthonormal :math:`e_0, e_1, \dots, e_m`, and
:math:`Q` uniform over :math:`g_1..g_m`. For :math:`k` distinct draws the Gram matrix
is :math:`\mathbf 1\mathbf 1^\top + \sigma^2 I`, the fit is
:math:`\frac{k}{k+\sigma^2} e_0 + \frac{\sigma}{k+\sigma^2}\sum_{i \in S} e_i`, and

.. math::
    R_k = \frac{\sigma^2}{k + \sigma^2}, \qquad
    D = \frac{2k\sigma^2}{(k + \sigma^2)^2}\ \text{(disjoint draws)}, \qquad
    \frac{D}{R_k - R_{2k}} = 4 - \frac{2\sigma^2}{k + \sigma^2} \xrightarrow[\sigma^2/k \to 0]{} 4 .

(The ratio is taken against :math:`R_k - R_{2k}`, the bound without its factor 4;
:math:`D / (4(R_k - R_{2k}))` tends to 1.) In the limit :math:`m \to \infty` draws are
distinct and two runs' draws disjoint; :func:`tightness_pairs` draws from a finite
:math:`m`, where repeats make the ratio a little smaller. Functions of :math:`L_2(P)` are
vectors over :math:`m + 1` points with :math:`P` uniform, :math:`e_j = \sqrt{m+1}\,
1_{\{j\}}`, and every fit is the stacking code's least-squares fit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib import ticker
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from distrank.agreement.core import Seed, check_resources, child_seed, pair_rngs, summarize
from distrank.agreement.figures import D_LABEL, INTEGER_TICKS
from distrank.agreement.stacking import span_fit, stacking_pairs_from_bases
from distrank.figures import new_figure, paper_style

__all__ = [
    "tightness_ratio",
    "tightness_terms",
    "construction_terms",
    "tightness_pairs",
    "tightness_summary",
    "tightness_figure",
]


def tightness_ratio(k, sigma2):
    r"""Closed form :math:`\mathbb E[D] / (\bar R_k - \bar R_{2k}) = 4 - 2\sigma^2/(k + \sigma^2)`
    (the limit of many base models)."""
    k, sigma2 = np.asarray(k, dtype=np.float64), np.asarray(sigma2, dtype=np.float64)
    return 4.0 - 2.0 * sigma2 / (k + sigma2)


def tightness_terms(k, sigma2) -> dict[str, np.ndarray]:
    r"""Closed forms in the limit: :math:`R_k = \sigma^2/(k+\sigma^2)`,
    :math:`R_{2k}`, :math:`D = 2k\sigma^2/(k+\sigma^2)^2` and the bound :math:`4(R_k - R_{2k})`."""
    k, s2 = np.asarray(k, dtype=np.float64), np.asarray(sigma2, dtype=np.float64)
    r_k, r_2k = s2 / (k + s2), s2 / (2 * k + s2)
    return {"R_k": r_k, "R_2k": r_2k, "D": 2 * k * s2 / (k + s2) ** 2, "bound": 4 * (r_k - r_2k)}


def _unit(m_points: int, index: np.ndarray) -> np.ndarray:
    r"""Columns :math:`e_j = \sqrt{M}\, 1_{\{j\}}` (orthonormal under P uniform over M points)."""
    out = np.zeros((m_points, len(index)))
    out[index, np.arange(len(index))] = np.sqrt(m_points)
    return out


def _bases(indices: np.ndarray, sigma2: float, m_points: int) -> np.ndarray:
    r"""Columns :math:`g_i = e_0 + \sigma e_i` for the drawn ``indices`` (1-based)."""
    e0 = _unit(m_points, np.array([0]))
    return e0 + np.sqrt(sigma2) * _unit(m_points, np.asarray(indices))


def construction_terms(k: int, sigma2: float) -> dict[str, float]:
    r"""The construction computed numerically for disjoint draws (the :math:`m \to \infty`
    limit): least-squares fits over :math:`G = \{g_1..g_k\}`, :math:`G' = \{g_{k+1}..g_{2k}\}`
    and :math:`G \cup G'` on :math:`2k + 1` points; returns ``R_k`` (mean of the two),
    ``R_2k``, ``D`` and ``ratio`` :math:`D / (R_k - R_{2k})`."""
    if not (isinstance(k, int) and k >= 1) or not sigma2 > 0:
        raise ValueError(f"need integer k >= 1 and sigma2 > 0, got k={k}, sigma2={sigma2}")
    m_points = 2 * k + 1
    y = _unit(m_points, np.array([0]))[:, 0]
    g1, g2 = (
        _bases(np.arange(1, k + 1), sigma2, m_points),
        _bases(np.arange(k + 1, 2 * k + 1), sigma2, m_points),
    )
    f1, f2, union = span_fit(g1, y), span_fit(g2, y), span_fit(np.hstack([g1, g2]), y)
    r_k = (np.mean((y - f1) ** 2) + np.mean((y - f2) ** 2)) / 2
    r_2k = np.mean((y - union) ** 2)
    d = np.mean((f1 - f2) ** 2)
    return {"R_k": float(r_k), "R_2k": float(r_2k), "D": float(d), "ratio": float(d / (r_k - r_2k))}


def tightness_pairs(
    ks: Sequence[int], *, sigma2s: Sequence[float], m: int, n_pairs: int, seed: Seed
) -> pd.DataFrame:
    r"""Stacking pairs on the construction with :math:`Q` uniform over ``m`` base
    models (draws i.i.d., so repeats happen): the columns of
    :func:`~distrank.agreement.stacking.stacking_pairs_from_bases` plus ``sigma2``."""
    ks = check_resources(ks, "ks")
    if not (isinstance(m, int) and m >= 1) or not sigma2s or any(not s > 0 for s in sigma2s):
        raise ValueError(f"need integer m >= 1 and positive sigma2s, got m={m}, sigma2s={sigma2s}")
    m_points = m + 1
    y = _unit(m_points, np.array([0]))[:, 0]
    parts = []
    for i, sigma2 in enumerate(sigma2s):
        bases = (
            tuple(_bases(rng.integers(1, m + 1, size=ks[-1]), sigma2, m_points) for rng in (r1, r2))
            for _, r1, r2 in pair_rngs(child_seed(seed, i), n_pairs)
        )
        part = stacking_pairs_from_bases(y, bases, ks, data=f"sigma2={sigma2:g}")
        parts.append(part.assign(sigma2=float(sigma2)))
    return pd.concat(parts, ignore_index=True)


def tightness_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    r"""Per :math:`\sigma^2` and :math:`k`: the summary of the pairs, the measured
    ratio :math:`\overline D / (\bar R_k - \bar R_{2k})` (``ratio``), and the limits
    ``ratio_limit``, ``D_limit``, ``bound_limit`` from :func:`tightness_terms`."""
    summary = summarize(pairs, by=("sigma2", "resource"))
    grouped = pairs.groupby(["sigma2", "resource"], sort=True)
    gap = (
        (grouped["R_G"].mean() + grouped["R_G2"].mean()) / 2 - grouped["R_union"].mean()
    ).to_numpy()
    summary["ratio"] = summary["D_mean"] / gap
    limits = tightness_terms(summary["resource"], summary["sigma2"])
    summary["ratio_limit"] = tightness_ratio(summary["resource"], summary["sigma2"])
    summary["D_limit"], summary["bound_limit"] = limits["D"], limits["bound"]
    return summary


def tightness_figure(summary: pd.DataFrame) -> Figure:
    r"""Left: :math:`D` and the bound :math:`4(\bar R_k - \bar R_{2k})` against :math:`k`,
    measured (markers, 95 % intervals) and in the limit (lines), per :math:`\sigma^2`.
    Right: the ratio :math:`D / (\bar R_k - \bar R_{2k})` and its limit
    :math:`4 - 2\sigma^2/(k+\sigma^2)`, approaching 4."""
    with paper_style():
        fig, axes = new_figure(1, 2, width="double", height=2.6)
        left, right = axes[0]
        keys = []
        for i, (sigma2, rows) in enumerate(summary.groupby("sigma2", sort=True)):
            color = f"C{i}"
            k = rows["resource"].to_numpy(dtype=float)
            d = rows["D_mean"].to_numpy()
            err = [d - rows["D_lo"].to_numpy(), rows["D_hi"].to_numpy() - d]
            left.errorbar(k, d, yerr=err, color=color, ls="none", marker="o", ms=3, capsize=2)
            left.plot(k, rows["bound_mean"], color=color, ls="none", marker="^", ms=3)
            left.plot(k, rows["D_limit"], color=color, lw=0.9)
            left.plot(k, rows["bound_limit"], color=color, lw=0.9, ls="--")
            right.plot(k, rows["ratio"], color=color, ls="none", marker="s", ms=3)
            right.plot(k, rows["ratio_limit"], color=color, lw=0.9)
            keys.append(Line2D([], [], color=color, lw=3, label=rf"$\sigma^2 = {sigma2:g}$"))
        grey = {"color": "0.3", "ms": 3}
        keys += [
            Line2D([], [], ls="none", marker="o", label=D_LABEL, **grey),
            Line2D(
                [], [], ls="none", marker="^", label=r"bound $4(\bar R_k - \bar R_{2k})$", **grey
            ),
            Line2D([], [], lw=0.9, label=r"$D$ for $m \to \infty$", **grey),
            Line2D([], [], lw=0.9, ls="--", label=r"bound for $m \to \infty$", **grey),
            Line2D([], [], ls="none", marker="s", label="measured ratio", **grey),
        ]
        right.axhline(4.0, color="0.5", lw=0.8, ls=":")
        for ax in (left, right):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(INTEGER_TICKS)
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
            ax.set_xlabel("base models stacked, $k$")
        left.set_yscale("log")
        left.set_ylabel("disagreement $D$, bound")
        right.set_ylabel(
            r"$D\,/\,(\bar R_k - \bar R_{2k})$ (lines: $4 - 2\sigma^2/(k + \sigma^2)$)"
        )
        right.set_ylim(bottom=min(2.0, float(summary["ratio"].min()) - 0.1), top=4.2)
        left.set_title("disagreement and stacking bound")
        right.set_title("the constant: the ratio tends to 4")
        fig.legend(handles=keys, loc="outside lower center", ncols=4)
    return fig
