r"""A1, stacking: disagreement of least-squares stacks of :math:`k` random base models.

A run draws :math:`k` base models i.i.d. from :math:`Q` (here: a depth-``depth``
regression tree fit on a fresh ``n_base``-point sample from :math:`P`) and fits the
least-squares combination over their span, :math:`f = \arg\min_{g \in \mathrm{span}(G)}
\mathrm{MSE}(g)`, with risk :math:`R(G)`. Since :math:`\mathrm{span}(G \cup G')` holds
both fits and their average, the midpoint identity gives, for every pair
(Eaton et al., arXiv:2602.23360, stacking theorem),

.. math::
    D(f, f') \le 2\bigl(R(G) - R(G \cup G')\bigr) + 2\bigl(R(G') - R(G \cup G')\bigr),
    \qquad
    \mathbb E[D] \le 4(\bar R_k - \bar R_{2k}),

:math:`\bar R_t` the expected risk of the span of :math:`t` draws. The fits and the
risks use one evaluation sample (the population's: every row of a finite set, or a
large fresh sample standing in for :math:`P`), so the pointwise bound holds exactly
for that distribution, up to float rounding; the mean of the pointwise bound over
pairs estimates :math:`4(\bar R_k - \bar R_{2k})`, the union of two runs' draws being
:math:`2k` draws from :math:`Q`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from sklearn.tree import DecisionTreeRegressor

from distrank.agreement.core import (
    Seed,
    check_resources,
    midpoint_terms,
    model_seed,
    pair_rngs,
    summarize,
)
from distrank.agreement.data import Population
from distrank.agreement.figures import agreement_figure

__all__ = [
    "span_fit",
    "tree_base_models",
    "stacking_pairs_from_bases",
    "stacking_pairs",
    "stacking_summary",
    "stacking_figure",
]


def span_fit(basis: np.ndarray, y: np.ndarray) -> np.ndarray:
    r"""The least-squares fit of ``y`` over the span of the columns of ``basis``
    (``(m, k)``), :math:`B (B^\top B)^{+} B^\top y`, by ``numpy.linalg.lstsq`` (SVD,
    rank-deficient bases allowed)."""
    basis = np.asarray(basis, dtype=np.float64)
    if basis.ndim != 2 or basis.shape[0] != len(y):
        raise ValueError(f"basis must be (m, k) with m = len(y) = {len(y)}, got {basis.shape}")
    coef, *_ = np.linalg.lstsq(basis, np.asarray(y, dtype=np.float64), rcond=None)
    return basis @ coef


def tree_base_models(
    population: Population, n_models: int, *, n_base: int, depth: int, rng: np.random.Generator
) -> np.ndarray:
    """Predictions on ``population.X`` (``(m, n_models)``) of ``n_models`` draws from
    :math:`Q`: depth-``depth`` trees, each fit on its own fresh ``n_base``-point sample."""
    columns = []
    for _ in range(n_models):
        X, y = population.draw(n_base, rng)
        tree = DecisionTreeRegressor(max_depth=depth, random_state=model_seed(rng)).fit(X, y)
        columns.append(tree.predict(population.X))
    return np.column_stack(columns)


def stacking_pairs_from_bases(
    y: np.ndarray, bases: Iterable[tuple[np.ndarray, np.ndarray]], ks: Sequence[int], *, data: str
) -> pd.DataFrame:
    """Pair rows from given base-model predictions: item ``i`` of ``bases`` is pair ``i``'s two
    ``(m, k_max)`` matrices; stack ``k`` uses their first ``k`` columns.

    Columns: ``data, resource (k), pair, mse_f1, mse_f2, mse_fbar, D,
    identity_residual, R_G, R_G2 (= R(G')), R_union (= R(G u G')), bound`` (the
    pointwise bound) and ``slack`` (``bound - D``, zero or more up to rounding).
    """
    ks = check_resources(ks, "ks")
    rows = []
    for pair, (g1, g2) in enumerate(bases):
        if g1.shape[1] < ks[-1] or g2.shape[1] < ks[-1]:
            raise ValueError(
                f"pair {pair}: base models have {g1.shape[1]}, {g2.shape[1]} columns, need {ks[-1]}"
            )
        for k in ks:
            f1, f2 = span_fit(g1[:, :k], y), span_fit(g2[:, :k], y)
            union = span_fit(np.hstack([g1[:, :k], g2[:, :k]]), y)
            terms = midpoint_terms(y, f1, f2)
            r_union = float(np.mean((y - union) ** 2))
            bound = 2 * (terms["mse_f1"] - r_union) + 2 * (terms["mse_f2"] - r_union)
            rows.append(
                {
                    "data": data,
                    "resource": k,
                    "pair": pair,
                    **terms,
                    "R_G": terms["mse_f1"],
                    "R_G2": terms["mse_f2"],
                    "R_union": r_union,
                    "bound": bound,
                    "slack": bound - terms["D"],
                }
            )
    return pd.DataFrame(rows)


def stacking_pairs(
    population: Population, ks: Sequence[int], *, n_pairs: int, n_base: int, depth: int, seed: Seed
) -> pd.DataFrame:
    """A1 pairs: each run draws ``max(ks)`` trees from :math:`Q` with its own seed
    (see :func:`stacking_pairs_from_bases` for the columns)."""
    ks = check_resources(ks, "ks")
    bases = (  # one pair at a time: a run's predictions are (m, max(ks)) floats
        tuple(
            tree_base_models(population, ks[-1], n_base=n_base, depth=depth, rng=rng)
            for rng in (r1, r2)
        )
        for _, r1, r2 in pair_rngs(seed, n_pairs)
    )
    return stacking_pairs_from_bases(population.y, bases, ks, data=population.name)


def stacking_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    r"""Per data set and :math:`k`: mean :math:`D` with its 95 % interval, the bound
    :math:`4(\bar R_k - \bar R_{2k})` (mean of the pointwise bounds), the mean risks
    :math:`\bar R_k`, :math:`\bar R_{2k}`, the pairs where the pointwise bound is
    below :math:`D` (none, up to rounding) and the smallest slack."""
    summary = summarize(pairs)
    grouped = pairs.groupby(["data", "resource"], sort=True)
    summary["R_k"] = ((grouped["R_G"].mean() + grouped["R_G2"].mean()) / 2).to_numpy()
    summary["R_2k"] = grouped["R_union"].mean().to_numpy()
    summary["min_slack"] = grouped["slack"].min().to_numpy()
    return summary


def stacking_figure(summary: pd.DataFrame) -> Figure:
    r""":math:`D` against :math:`k` per data set, with :math:`4(\bar R_k - \bar R_{2k})`."""
    return agreement_figure(
        summary,
        resource_label="base models stacked, $k$",
        bounds={"bound": r"bound $4(\bar R_k - \bar R_{2k})$"},
    )
