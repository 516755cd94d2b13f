r"""Data distributions of the agreement study, all shipped with scikit-learn (no download).

A :class:`Population` is a distribution :math:`P` we can draw training samples from,
plus the evaluation sample on which every MSE and :math:`D` is computed:

- ``friedman1``: :func:`sklearn.datasets.make_friedman1` with noise 1,
  :math:`y = 10\sin(\pi x_1 x_2) + 20(x_3 - \tfrac12)^2 + 10 x_4 + 5 x_5 + N(0, 1)`,
  :math:`x \sim U[0, 1]^{10}`; Bayes MSE 1. Evaluation: a large fresh sample.
- ``diabetes`` (:func:`sklearn.datasets.load_diabetes`, 442 rows), ``digits_onehot``
  and ``digits_binary`` (:func:`sklearn.datasets.load_digits`, 1797 rows, pixels
  scaled to [0, 1]; targets one-hot in :math:`\mathbb R^{10}`, or the label
  :math:`1[\mathrm{digit} \ge 5]`): :math:`P` is the uniform distribution over the
  rows, a training sample is ``n`` rows drawn with replacement, and the evaluation
  sample is every row, so risks and :math:`D` are exact. The diabetes target is
  centred and scaled by its standard deviation over the rows (a fixed map of
  :math:`P`), so an MSE of 1 is that of the constant predictor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from sklearn import datasets

__all__ = [
    "Population",
    "POPULATIONS",
    "population",
    "friedman1",
    "diabetes",
    "digits_onehot",
    "digits_binary",
]


@dataclass(frozen=True)
class Population:
    """A distribution to train on and the sample (``X``, ``y``) to evaluate on.

    ``draw(n, rng)`` returns ``n`` i.i.d. training points; ``bayes_mse`` is the Bayes
    risk under squared loss where known (``None`` otherwise).
    """

    name: str
    X: np.ndarray
    y: np.ndarray
    sampler: Callable[[int, np.random.Generator], tuple[np.ndarray, np.ndarray]] = field(repr=False)
    bayes_mse: float | None = None

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        return self.sampler(int(n), rng)


def friedman1(*, n_eval: int, seed: int) -> Population:
    """Friedman #1 (10 features, noise 1); the evaluation sample is ``n_eval`` fresh
    points drawn with ``seed``, training samples come from a run's generator."""
    if not isinstance(n_eval, (int, np.integer)) or n_eval < 1:
        raise ValueError(f"n_eval must be a positive integer, got {n_eval!r}")
    X, y = datasets.make_friedman1(n_samples=n_eval, n_features=10, noise=1.0, random_state=seed)

    def sampler(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        return datasets.make_friedman1(
            n_samples=n, n_features=10, noise=1.0, random_state=int(rng.integers(2**31 - 1))
        )

    return Population("friedman1", X, y, sampler, bayes_mse=1.0)


def _rows_population(name: str, X: np.ndarray, y: np.ndarray) -> Population:
    """:math:`P` uniform over the rows of ``(X, y)``; samples are rows with replacement."""

    def sampler(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(len(X), size=n)
        return X[idx], y[idx]

    return Population(name, X, y, sampler, bayes_mse=None)


def diabetes() -> Population:
    """Diabetes (442 rows, 10 features), target standardised over the rows."""
    X, y = datasets.load_diabetes(return_X_y=True)
    return _rows_population("diabetes", X, (y - y.mean()) / y.std())


def _digits() -> tuple[np.ndarray, np.ndarray]:
    X, labels = datasets.load_digits(return_X_y=True)
    return X / 16.0, labels


def digits_onehot() -> Population:
    """Digits (1797 rows, 64 pixels in [0, 1]) with one-hot targets in R^10."""
    X, labels = _digits()
    return _rows_population("digits_onehot", X, np.eye(10)[labels])


def digits_binary() -> Population:
    """Digits with the binary label 1[digit >= 5] (for the logistic loss)."""
    X, labels = _digits()
    return _rows_population("digits_binary", X, (labels >= 5).astype(np.float64))


POPULATIONS = ("friedman1", "diabetes", "digits_onehot", "digits_binary")


def population(name: str, *, n_eval: int, seed: int) -> Population:
    """The population called ``name`` (one of ``POPULATIONS``); ``n_eval`` and
    ``seed`` fix the evaluation sample of ``friedman1`` and are unused otherwise."""
    if name == "friedman1":
        return friedman1(n_eval=n_eval, seed=seed)
    makers = {"diabetes": diabetes, "digits_onehot": digits_onehot, "digits_binary": digits_binary}
    if name not in makers:
        raise ValueError(f"data must be one of {list(POPULATIONS)}, got {name!r}")
    return makers[name]()
