r"""A4, regression trees: disagreement of depth-:math:`d` trees.

Grafting a copy of one depth-:math:`d` tree at every leaf of another gives a
depth-:math:`2d` tree computing their average (leaf values averaged), so
:math:`\bar f \in \mathrm{Tree}_{2d}` and, for :math:`\varepsilon`-near-optimal trees
(Eaton et al., arXiv:2602.23360, regression-tree theorem),

.. math::
    D(f_1, f_2) \le 4\bigl(R(\mathrm{Tree}_d) - R(\mathrm{Tree}_{2d}) + \varepsilon\bigr).

The theorem's class has leaf values in [0, 1]; the closure holds for any leaf
values, and bounded leaves only enter the generalisation of near-optimality, so the
targets are not rescaled. Here CART (``DecisionTreeRegressor(max_depth=d)``) fits
each run's own training sample; the risks of :math:`\mathrm{Tree}_d` and
:math:`\mathrm{Tree}_{2d}` are plugged in from the same runs' depth-:math:`d` and
depth-:math:`2d` trees (:func:`~distrank.agreement.core.lemma_bound`). CART is
greedy and overfits small samples at depth :math:`2d`, which is where the plug-in
bound goes negative or below :math:`D`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from sklearn.tree import DecisionTreeRegressor

from distrank.agreement.core import learning_curve_pairs
from distrank.agreement.data import Population
from distrank.agreement.figures import agreement_figure, lemma_labels

__all__ = ["fit_tree", "trees_pairs", "trees_figure"]


def fit_tree(X: np.ndarray, y: np.ndarray, depth: int, seed: int, X_eval: np.ndarray) -> np.ndarray:
    """Predictions on ``X_eval`` of a CART tree of depth at most ``depth``."""
    return DecisionTreeRegressor(max_depth=depth, random_state=seed).fit(X, y).predict(X_eval)


def trees_pairs(population: Population, depths: Sequence[int], **options) -> pd.DataFrame:
    """A4 pairs (columns of :func:`~distrank.agreement.core.learning_curve_pairs`, whose
    ``n_train``, ``n_pairs`` and ``seed`` are ``options``; ``resource`` is the depth)."""
    return learning_curve_pairs(
        population, partial(fit_tree, X_eval=population.X), depths, **options
    )


def trees_figure(summary: pd.DataFrame) -> Figure:
    """:math:`D` against depth per data set, with the plug-in bounds."""
    return agreement_figure(
        summary,
        resource_label="tree depth, $d$ (bound from depth $2d$)",
        bounds=lemma_labels("d"),
    )
