r"""FD estimated well, with its terms: FD of models against fixed clients, pooled (all)
and per client (avg), in several *settings*: the features as scored, their projection on
the pool's first principal axes, and the value extrapolated to infinite samples in 1/m
(FID∞ of Chong and Forsyth, "Effectively Unbiased FID and Inception Score and where to
find them", CVPR 2020). Each value comes with FD's terms, so that a reader sees which of
them moves (:data:`TERMS`, and :data:`SPLIT`, the part of the model's trace between its
classes). E4's pre-step uses it (:func:`distrank.experiments.e4_diversity_sweep.steps.write_fd`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from distrank.clients import client_weights
from distrank.metrics.fd._family import FD_METRIC

__all__ = [
    "TERMS",
    "SPLIT",
    "FEATURES",
    "EXTRAPOLATED",
    "pca_basis",
    "extrapolate",
    "between_classes",
    "ClientGaussians",
    "FdSettings",
    "with_fd",
]

#: FD's terms (metrics.fd._frechet.FrechetTerms), FD = mean + trace_reference + trace_model - 2 root.
TERMS = ("mean", "trace_reference", "trace_model", "root")
#: ... and the part of the model's tr C_Y that lies between its classes (the rest is within).
SPLIT = "trace_between"
#: The setting of FD as the pipeline scores it, and of FD extrapolated from it.
FEATURES, EXTRAPOLATED = "features", "extrapolated"


def pca_basis(pool: np.ndarray, dims: int) -> np.ndarray:
    """The first ``dims`` principal axes of ``pool``'s rows as a (d, dims) matrix:
    scikit-learn's PCA with the ``covariance_eigh`` solver (a (d, d) covariance, not
    an SVD of the rows), on one thread. FD needs no centring: a shift moves both sides
    alike."""
    from sklearn.decomposition import PCA

    from distrank.metrics.fd._frechet import one_thread_each

    if not 1 <= dims <= min(pool.shape):
        raise ValueError(f"pca_dims: {dims} is not between 1 and {min(pool.shape)}")
    with one_thread_each():  # its eigh on one thread: the same axes in every process
        return PCA(n_components=dims, svd_solver="covariance_eigh").fit(pool).components_.T


def extrapolate(sizes: Sequence[float], values) -> np.ndarray:
    r"""The intercept of the least-squares line through ``values`` (one row per sample
    size m) in :math:`1/m`: the value at :math:`m \to \infty`, as FID∞ of Chong and
    Forsyth ("Effectively Unbiased FID and Inception Score and where to find them",
    CVPR 2020). Each column is fitted on its own."""
    sizes = np.asarray(sizes, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if sizes.ndim != 1 or len(np.unique(sizes)) < 2 or values.shape[:1] != sizes.shape:
        raise ValueError(f"extrapolate: needs one row of values per size, two sizes; got {sizes}")
    design = np.stack([np.ones_like(sizes), 1.0 / sizes], axis=1)
    coef, *_ = np.linalg.lstsq(design, values.reshape(len(sizes), -1), rcond=None)
    return coef[0].reshape(values.shape[1:])


def _subsample(n: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """The indices of a random ``fraction`` of ``n`` rows (at least 2), in order."""
    return np.sort(rng.permutation(n)[: max(2, round(fraction * n))])


def between_classes(x: np.ndarray, labels) -> float:
    r"""The part of :math:`\operatorname{tr} C` (ddof=1) between the classes of the rows,
    :math:`\sum_c n_c \lVert \mu_c - \mu\rVert^2 / (n - 1)`; the rest,
    :math:`\sum_c (n_c - 1) \operatorname{tr} C_c / (n - 1)`, is within them. NaN
    without labels."""
    if labels is None:
        return float("nan")
    classes, index, counts = np.unique(labels, return_inverse=True, return_counts=True)
    means = np.zeros((len(classes), x.shape[1]))
    np.add.at(means, index, x)
    means /= counts[:, None]
    return float(counts @ ((means - x.mean(axis=0)) ** 2).sum(axis=1) / (len(x) - 1))


class ClientGaussians:
    """The clients' Gaussian statistics in one setting (a PCA basis, a subsample of
    every client) and the pool's, and their weights."""

    def __init__(self, clients: Sequence[np.ndarray], weights: str, basis=None):
        from distrank.metrics.fd._frechet import gaussian_stats, pool_stats

        self.basis = basis
        self.clients = [gaussian_stats(self.project(c)) for c in clients]
        self.pool = pool_stats(self.clients)
        self.weights = client_weights([s.n for s in self.clients], weights)

    def project(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return x if self.basis is None else x @ self.basis

    def terms(self, models, pool=None) -> list[dict[str, np.ndarray]]:
        """FD's :data:`TERMS` of each of ``models`` (rows, or Gaussian statistics)
        against the pool (``all``; ``pool`` in its place if given) and the clients'
        weighted mean (``avg``), one dict per model."""
        from distrank.metrics.fd._frechet import GaussianStats, frechet_terms, gaussian_stats

        models = [
            m if isinstance(m, GaussianStats) else gaussian_stats(self.project(m)) for m in models
        ]
        t = frechet_terms([*self.clients, pool or self.pool], models)
        values = np.stack([getattr(t, name) for name in TERMS], axis=2)  # (k + 1, models, 4)
        return [
            {"all": v[-1], "avg": FD_METRIC.average(v[:-1].T, self.weights)}
            for v in values.swapaxes(0, 1)
        ]

    def fitted(self, scales: Sequence[float]) -> list[dict[str, np.ndarray]]:
        r"""The terms of the fitted family's own Gaussian :math:`N(\bar\mu, sW + B)` at
        each scale s, against the clients' Gaussians and against their mixture's,
        :math:`N(\bar\mu, W + B)` (:math:`\lambda`-weighted, as Theorem 2's pool)."""
        from distrank.metrics.fd._frechet import GaussianStats

        lam, n = self.weights, sum(s.n for s in self.clients)
        means = np.stack([s.mean for s in self.clients])
        mean = lam @ means
        within = sum(w * s.cov for w, s in zip(lam, self.clients))
        between = (means - mean).T @ ((means - mean) * lam[:, None])
        models = [GaussianStats(n, mean, s * within + between) for s in scales]
        return self.terms(models, pool=GaussianStats(n, mean, within + between))


class FdSettings:
    """FD of models against fixed clients in every setting, with its terms.

    ``features``: the clients' rows as they are (what the pipeline scores);
    ``pca<d>``: clients and models projected on the pool's first d principal axes
    (:func:`pca_basis`, fitted once); ``extrapolated``: FD's terms at each of
    ``fractions`` of every sample (each client's rows and the model's, so that their
    ratio stays put; at fraction 1 the ``features`` value), averaged over ``draws``
    random subsamples, then extrapolated in 1/m (:func:`extrapolate`). FD's bias is
    O(1/n + 1/m) (Chong and Forsyth 2020), a line in 1/m while n/m is fixed. A
    (fraction, draw) subsamples every model with the same generator.
    """

    def __init__(
        self,
        clients: Sequence[np.ndarray],
        *,
        pca_dims: Sequence[int] = (),
        extrapolation: Mapping | None = None,
        weights: str = "size",
        seed: int = 0,
    ):
        self.seed = seed
        self.spaces = {FEATURES: ClientGaussians(clients, weights)}
        if pca_dims:  # one fit: the first d axes of the widest are those of d
            pool = np.concatenate([np.asarray(c, dtype=np.float64) for c in clients])
            axes = pca_basis(pool, max(pca_dims))
            for d in pca_dims:
                self.spaces[f"pca{d}"] = ClientGaussians(clients, weights, axes[:, :d])
        fractions = sorted((extrapolation or {}).get("fractions", []))
        if extrapolation and (
            len(set(fractions)) < 2 or not 0 < fractions[0] <= fractions[-1] <= 1
        ):
            raise ValueError(
                f"extrapolation.fractions: expected two or more in (0, 1], got {fractions}"
            )
        self.subsamples = []  # (fraction, draw, the clients' statistics)
        for f in fractions:
            for draw in range(1 if f == 1 else extrapolation.get("draws", 1)):
                rng = self._rng(f, draw, "clients")
                subs = None if f == 1 else [c[_subsample(len(c), f, rng)] for c in clients]
                space = self.spaces[FEATURES] if f == 1 else ClientGaussians(subs, weights)
                self.subsamples.append((f, draw, space))

    def _rng(self, fraction: float, draw: int, side: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, round(fraction * 1e6), draw, int(side == "model")])

    def terms(self, y: np.ndarray, labels=None) -> dict[str, dict[str, np.ndarray]]:
        """Setting -> aggregation -> FD's :data:`TERMS` and :data:`SPLIT` (by
        ``labels``, the classes of the rows) for the model with rows ``y``."""
        out = {name: _terms(space, y, labels) for name, space in self.spaces.items()}
        if self.subsamples:
            runs: dict[float, list] = {}
            for f, draw, space in self.subsamples:
                keep = slice(None) if f == 1 else _subsample(len(y), f, self._rng(f, draw, "model"))
                mine = None if labels is None else np.asarray(labels)[keep]
                runs.setdefault(len(y[keep]), []).append(_terms(space, y[keep], mine))
            out[EXTRAPOLATED] = {
                agg: extrapolate(
                    list(runs), [np.mean([t[agg] for t in r], 0) for r in runs.values()]
                )
                for agg in ("all", "avg")
            }
        return out

    def table(self, models) -> pd.DataFrame:
        """Columns ``setting, model, aggregation``, the :data:`TERMS`, :data:`SPLIT`
        and ``fd``, for each ``(name, rows, labels)`` of ``models`` (an iterable: one
        model in memory at a time; labels may be None)."""
        rows = [
            (setting, name, agg, *values)
            for name, y, labels in models
            for setting, by_agg in self.terms(y, labels).items()
            for agg, values in by_agg.items()
        ]
        columns = ["setting", "model", "aggregation", *TERMS, SPLIT]
        return with_fd(pd.DataFrame(rows, columns=columns))

    def theory(self, scales: Sequence[float]) -> pd.DataFrame:
        """The fitted family's FD without sampling (its own Gaussian, not its draws) at each
        scale, in every setting (``extrapolated`` estimates the ``features`` value):
        columns ``setting, value, aggregation``, the :data:`TERMS` and ``fd``."""
        rows = [
            (setting, float(s), agg, *values)
            for setting, space in self.spaces.items()
            for s, terms in zip(scales, space.fitted(scales))
            for agg, values in terms.items()
        ]
        table = pd.DataFrame(rows, columns=["setting", "value", "aggregation", *TERMS])
        if self.subsamples:
            table = pd.concat(
                [table, table[table.setting == FEATURES].assign(setting=EXTRAPOLATED)],
                ignore_index=True,
            )
        return with_fd(table)


def _terms(space: ClientGaussians, y: np.ndarray, labels) -> dict[str, np.ndarray]:
    """:meth:`ClientGaussians.terms` of one model, with :func:`between_classes` appended."""
    between = between_classes(space.project(y), labels)
    return {agg: np.append(values, between) for agg, values in space.terms([y])[0].items()}


def with_fd(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with FD's sum of its :data:`TERMS` as column ``fd``, as
    :class:`~distrank.metrics.fd.FrechetTerms` sums them."""
    from distrank.metrics.fd._frechet import FrechetTerms

    table["fd"] = FrechetTerms(*(table[term] for term in TERMS)).fd
    return table
