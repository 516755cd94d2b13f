r"""A6, beyond scalar squared loss: multi-output regression and a strongly convex loss.

For a loss :math:`\ell(y, \cdot)` that is :math:`\mu`-strongly convex on the
predictions and vector outputs, the anchoring step becomes (Eaton et al.,
arXiv:2602.23360, extension to strongly convex losses)

.. math::
    D = \mathbb E \lVert f_1 - f_2 \rVert^2
        \le \frac{4}{\mu}\bigl(R(f_1) + R(f_2) - 2R(\bar f)\bigr),
    \qquad
    D \le \frac{8}{\mu}\bigl(R(F_n) - R(F_{2n}) + \varepsilon\bigr)

(squared loss: :math:`\mu = 2` and the first is the midpoint identity). Two settings,
both regression trees of depth :math:`d` (anchor class depth :math:`2d`, as in A4)
on the digits, with :math:`P` uniform over the 1797 rows:

- ``digits_onehot``: multi-output squared loss on one-hot targets in
  :math:`\mathbb R^{10}` (``DecisionTreeRegressor`` fits all outputs jointly), :math:`\mu = 2`.
- ``digits_binary``: logistic loss :math:`\log(1 + e^f) - y f` on the label
  :math:`1[\mathrm{digit} \ge 5]`, trees with leaf logits in :math:`[-B, B]` (CART
  splits, each leaf the loss-minimising logit of its training labels, clipped),
  strongly convex there with :math:`\mu = \sigma(B)(1 - \sigma(B))`. :math:`D` is in
  logit units.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy import special
from sklearn.tree import DecisionTreeRegressor

from distrank.agreement.core import Seed, as_risks, learning_curve_pairs, logistic_mu, summarize
from distrank.agreement.data import Population
from distrank.agreement.figures import agreement_figure, lemma_labels
from distrank.agreement.trees import trees_pairs

__all__ = [
    "fit_logit_tree",
    "multi_output_pairs",
    "logistic_pairs",
    "general_losses_summary",
    "general_losses_figure",
]


def fit_logit_tree(
    X: np.ndarray, y: np.ndarray, depth: int, seed: int, X_eval: np.ndarray, *, logit_bound: float
) -> np.ndarray:
    r"""Logits on ``X_eval`` of a depth-``depth`` tree for labels in {0, 1}: CART splits,
    leaf value :math:`\mathrm{clip}(\mathrm{logit}(\hat p), -B, B)` for the leaf's label
    mean :math:`\hat p` (the minimiser of the leaf's logistic loss over :math:`[-B, B]`)."""
    p = DecisionTreeRegressor(max_depth=depth, random_state=seed).fit(X, y).predict(X_eval)
    lo, hi = special.expit(-logit_bound), special.expit(logit_bound)
    return special.logit(np.clip(p, lo, hi))


def multi_output_pairs(
    population: Population, depths: Sequence[int], *, n_train: int, n_pairs: int, seed: Seed
) -> pd.DataFrame:
    """Multi-output squared-loss tree pairs (``mu = 2``), columns of
    :func:`~distrank.agreement.core.learning_curve_pairs` (``risk_`` for ``mse_``, as
    in the logistic pairs beside them: :func:`~distrank.agreement.core.as_risks`) plus
    ``loss``, ``mu``: the A4 tree pairs (:func:`~distrank.agreement.trees.trees_pairs`,
    squared loss) of a multi-output population."""
    pairs = trees_pairs(population, depths, n_train=n_train, n_pairs=n_pairs, seed=seed)
    return as_risks(pairs).assign(loss="squared", mu=2.0)


def logistic_pairs(
    population: Population,
    depths: Sequence[int],
    *,
    n_train: int,
    n_pairs: int,
    seed: Seed,
    logit_bound: float,
) -> pd.DataFrame:
    """Logistic-loss tree pairs with leaf logits in ``[-logit_bound, logit_bound]``."""
    mu = logistic_mu(logit_bound)
    fit = partial(fit_logit_tree, X_eval=population.X, logit_bound=logit_bound)
    pairs = learning_curve_pairs(
        population, fit, depths, n_train=n_train, n_pairs=n_pairs, seed=seed, loss="logistic", mu=mu
    )
    return pairs.assign(loss="logistic", mu=mu)


def general_losses_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    r"""Per setting and depth: :func:`~distrank.agreement.core.summarize` of the plug-in
    bound :math:`(8/\mu)(\dots)` (flags), its anchor form and the midpoint bound
    :math:`(4/\mu)(R(f_1) + R(f_2) - 2R(\bar f))`, with ``pairs_above_midpoint`` (pairs
    where :math:`D` exceeds the midpoint bound beyond rounding; none by the theorem)."""
    summary = summarize(pairs, bounds=("bound", "bound_anchor", "midpoint_bound"))
    grouped = pairs.groupby(["data", "resource"], sort=True)
    tol = 1e-9 * np.maximum(1.0, pairs["D"].abs())
    above = (
        (pairs["D"] > pairs["midpoint_bound"] + tol)
        .groupby([pairs["data"], pairs["resource"]])
        .sum()
    )
    summary["pairs_above_midpoint"] = above.to_numpy().astype(int)
    summary["mu"] = grouped["mu"].first().to_numpy()
    return summary


def general_losses_figure(summary: pd.DataFrame) -> Figure:
    """:math:`D` against depth for both settings, with the 8/mu and 4/mu bounds."""
    labels = lemma_labels("d", constant=r"\frac{8}{\mu}", half=r"\frac{4}{\mu}")
    labels["midpoint_bound"] = r"midpoint $\frac{4}{\mu}(R(f_1) + R(f_2) - 2R(\bar f))$"
    return agreement_figure(
        summary,
        resource_label="tree depth, $d$ (bound from depth $2d$)",
        bounds=labels,
        ylabel=r"disagreement $D = \mathbb{E}\,\Vert f_1 - f_2 \Vert^2$",
    )
