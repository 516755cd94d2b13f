r"""A3, neural networks: disagreement of one-hidden-layer ReLU networks of width :math:`n`.

Running two width-:math:`n` networks side by side and halving their output weights
gives a width-:math:`2n` network computing their average, so
:math:`\bar f \in \mathrm{NN}_{2n}` and, for :math:`\varepsilon`-near-optimal networks
(Eaton et al., arXiv:2602.23360, neural-network theorem, here its one-hidden-layer
special case),

.. math::
    D(f_1, f_2) \le 4\bigl(R(\mathrm{NN}_n) - R(\mathrm{NN}_{2n}) + \varepsilon\bigr).

Each run standardises inputs and target on its own training sample (a
``Pipeline`` of ``StandardScaler`` and ``MLPRegressor`` inside a
``TransformedTargetRegressor``, so predictions are in the target's units), trains
with L-BFGS (no weight decay) and keeps the best of ``restarts`` initialisations by
training MSE. The risks of :math:`\mathrm{NN}_n`, :math:`\mathrm{NN}_{2n}` are plugged
in from the same runs' width-:math:`n` and width-:math:`2n` networks.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from functools import partial

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from sklearn.compose import TransformedTargetRegressor
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from distrank.agreement.core import learning_curve_pairs
from distrank.agreement.data import Population
from distrank.agreement.figures import agreement_figure, lemma_labels

__all__ = ["fit_network", "networks_pairs", "networks_figure"]


def fit_network(
    X: np.ndarray,
    y: np.ndarray,
    width: int,
    seed: int,
    X_eval: np.ndarray,
    *,
    restarts: int,
    max_iter: int,
) -> np.ndarray:
    """Predictions on ``X_eval`` of the best (lowest training MSE) of ``restarts``
    width-``width`` ReLU networks trained by L-BFGS for at most ``max_iter`` iterations
    (initialisations seeded ``seed, seed + 1, ...``)."""
    if restarts < 1:
        raise ValueError(f"restarts must be >= 1, got {restarts}")
    best, best_mse = None, np.inf
    for r in range(restarts):
        net = MLPRegressor(
            hidden_layer_sizes=(width,),
            activation="relu",
            solver="lbfgs",
            alpha=0.0,
            max_iter=max_iter,
            random_state=seed + r,
        )
        model = TransformedTargetRegressor(
            regressor=make_pipeline(StandardScaler(), net), transformer=StandardScaler()
        )
        # the matrices are small: BLAS threads only add contention
        with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
            warnings.simplefilter("ignore", ConvergenceWarning)  # max_iter is the budget
            model.fit(X, y)
        mse = float(np.mean((model.predict(X) - y) ** 2))
        if mse < best_mse:
            best, best_mse = model, mse
    return best.predict(X_eval)


def networks_pairs(
    population: Population,
    widths: Sequence[int],
    *,
    restarts: int,
    max_iter: int,
    **options,
) -> pd.DataFrame:
    """A3 pairs (columns of :func:`~distrank.agreement.core.learning_curve_pairs`, whose
    ``n_train``, ``n_pairs`` and ``seed`` are ``options``; ``resource`` is the hidden width)."""
    fit = partial(fit_network, X_eval=population.X, restarts=restarts, max_iter=max_iter)
    return learning_curve_pairs(population, fit, widths, **options)


def networks_figure(summary: pd.DataFrame) -> Figure:
    """:math:`D` against hidden width per data set, with the plug-in bounds."""
    return agreement_figure(
        summary,
        resource_label="hidden width, $n$ (bound from width $2n$)",
        bounds=lemma_labels("n"),
    )
