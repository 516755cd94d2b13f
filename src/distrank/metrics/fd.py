"""Frechet distance (FD) between Gaussian fits, with pooled statistics from client statistics.

::

    FD(N(m1, C1), N(m2, C2)) = |m1 - m2|^2 + tr C1 + tr C2 - 2 tr (C1^1/2 C2 C1^1/2)^1/2

(Dowson and Landau, "The Frechet distance between multivariate normal
distributions", J. Multivariate Anal. 1982; FID of Heusel et al., NeurIPS 2017.)

The trace term needs no matrix square root: for any factor C1 = G1 G1^T and
H = C2^1/2 G1, the small symmetric matrix G1^T C2 G1 = H^T H has the nonzero
eigenvalues of H H^T = C2^1/2 C1 C2^1/2, which are those of C1^1/2 C2 C1^1/2
(the squared singular values of C1^1/2 C2^1/2), so

    tr (C1^1/2 C2 C1^1/2)^1/2 = sum_j sqrt(eig_j(G1^T C2 G1)),

summed over the eigenvalues above rounding noise (the others are zeros). G1 is
the centred rows (X1 - m1)^T / sqrt(n1 - 1) when a sample has no more rows than
features (``gaussian_stats`` keeps them: no factorisation at all), else the
Cholesky factor when C1 is positive definite, else V L^1/2 over the positive
eigenvalues of C1 (an ``eigh``), which drops the null space of a rank-deficient
covariance. A factor is computed once per covariance and reused against every
other; of two covariances the one of lower rank (bound: rows - 1) is factored,
which keeps the eigenproblem small and free of structural zeros when features
outnumber rows. Everything is float64; no ``scipy.linalg.sqrtm``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from distrank._arrays import as_features, resolve_device

BLOCK_SIZE = 8192  # rows per covariance update


@dataclass(frozen=True, eq=False)
class GaussianStats:
    """Sample size, mean (d,) and covariance (d, d, ddof=1) of a feature set; float64.

    ``factor``, when set, is a (d, k) matrix G with G G^T = cov: ``gaussian_stats``
    keeps the centred rows (X - mean)^T / sqrt(n - 1) when n <= d. It is local to the
    process (the statistics a Flower site shares are n, mean and cov only).
    """

    n: int
    mean: np.ndarray
    cov: np.ndarray
    factor: np.ndarray | None = field(default=None, repr=False)


def gaussian_stats(x, *, device=None, block_size: int = BLOCK_SIZE) -> GaussianStats:
    """Mean and covariance (ddof=1) of the rows of ``x``, streamed in row blocks.

    Two passes in float64 whatever the input dtype: the mean, then the centred
    scatter (X_b - mean)^T (X_b - mean) block by block (float32 products would
    move FD by ~1e-5 relative).
    """
    x = as_features(x, "x")
    n, d = x.shape
    if n < 2:
        raise ValueError(f"x: {n} row; a covariance (ddof=1) needs at least 2")
    dev = resolve_device(device)
    total = torch.zeros(d, dtype=torch.float64, device=dev)
    for b0 in range(0, n, block_size):
        total += x[b0 : b0 + block_size].to(dev).sum(dim=0, dtype=torch.float64)
    mean = total / n
    # The first block's product is the scatter (no zeros to add to): for a small client,
    # (d, d) temporaries cost more than its product.
    scatter = None
    for b0 in range(0, n, block_size):
        centred = x[b0 : b0 + block_size].to(dev, torch.float64) - mean
        product = centred.T @ centred
        scatter = product if scatter is None else scatter.add_(product)
    cov = scatter.add(scatter.T).div_(2 * (n - 1))  # exactly symmetric
    factor = (centred.T / (n - 1) ** 0.5).cpu().numpy() if n <= min(d, block_size) else None
    return GaussianStats(n, mean.cpu().numpy(), cov.cpu().numpy(), factor)


def pool_stats(stats: Sequence[GaussianStats]) -> GaussianStats:
    """The exact statistics of the union of the samples behind ``stats``.

    With n = sum n_i, mean = sum n_i mean_i / n and (ddof=1)

        (n - 1) C = sum_i (n_i - 1) C_i + sum_i n_i (mean_i - mean)(mean_i - mean)^T,

    the within-client plus the between-client scatter (Chan, Golub and LeVeque,
    "Algorithms for computing the sample variance", 1983).
    """
    if not stats:
        raise ValueError("stats: expected at least one GaussianStats")
    d = stats[0].mean.shape[0]
    if any(s.mean.shape != (d,) or s.cov.shape != (d, d) for s in stats):
        raise ValueError("stats: dimensions differ between the statistics")
    n = sum(s.n for s in stats)
    mean = sum(s.n * s.mean for s in stats) / n
    scatter = (stats[0].n - 1) * stats[0].cov  # in place from here: (d, d) temporaries
    for s in stats[1:]:  # dominate when clients are small
        scatter += (s.n - 1) * s.cov
    offsets = np.stack([s.mean - mean for s in stats])  # (k, d)
    scatter += (offsets.T * np.array([s.n for s in stats], dtype=np.float64)) @ offsets
    scatter /= n - 1
    return GaussianStats(n, mean, scatter)


def frechet_distance(a: GaussianStats, b: GaussianStats, *, device=None) -> float:
    """FD between the Gaussian fits ``a`` and ``b`` (see the module doc)."""
    return float(frechet_distances([a], [b], device=device)[0, 0])


@dataclass(frozen=True)
class FrechetTerms:
    """The terms of FD for every (reference, model) pair, each a (references, models)
    array: ``mean`` ``|m1 - m2|^2``, ``trace_reference`` tr C1, ``trace_model`` tr C2
    and ``root`` tr (C1^1/2 C2 C1^1/2)^1/2, so that FD = mean + traces - 2 root."""

    mean: np.ndarray
    trace_reference: np.ndarray
    trace_model: np.ndarray
    root: np.ndarray

    @property
    def fd(self) -> np.ndarray:
        # summed as before the terms were kept: FD is bitwise what it was
        return self.mean + (self.trace_reference + self.trace_model) - 2.0 * self.root


def frechet_distances(
    references: Sequence[GaussianStats], models: Sequence[GaussianStats], *, device=None
) -> np.ndarray:
    """FD of every (reference, model) pair as a (len(references), len(models)) array
    (the sum of :func:`frechet_terms`)."""
    return frechet_terms(references, models, device=device).fd


def frechet_terms(
    references: Sequence[GaussianStats], models: Sequence[GaussianStats], *, device=None
) -> FrechetTerms:
    """The terms of FD of every (reference, model) pair.

    Of each pair, the side with the lower rank bound min(n - 1, d) is factored (its
    kept rows, else ``sqrt_factor``), once per statistics and reused for all its
    pairs; a pair then costs two GEMMs and one symmetric eigenvalue problem of that rank.
    """
    stats = list(references) + list(models)
    dims = {s.mean.shape[0] for s in stats}
    if len(dims) > 1:
        raise ValueError(f"stats: dimensions differ between references and models: {sorted(dims)}")
    cache = _Factors(stats, resolve_device(device))
    shape = (len(references), len(models))
    mean, root = np.empty(shape), np.empty(shape)
    for r, ref in enumerate(references):
        for g, model in enumerate(models):
            i, j = r, len(references) + g
            if cache.rank_bound(j) < cache.rank_bound(i):
                i, j = j, i
            mean[r, g] = float(np.sum((ref.mean - model.mean) ** 2))
            root[r, g] = _root_trace(cache.factor(i), cache.cov(j))
    traces = [float(np.trace(s.cov)) for s in stats]
    trace_reference = np.repeat(np.array(traces[: len(references)])[:, None], shape[1], axis=1)
    trace_model = np.repeat(np.array(traces[len(references) :])[None, :], shape[0], axis=0)
    return FrechetTerms(mean, trace_reference, trace_model, root)


class _Factors:
    """The covariances (float64 on ``device``) and square-root factors of ``stats``,
    each made once, on first use."""

    def __init__(self, stats: Sequence[GaussianStats], device):
        self.stats, self.device = stats, device
        self.covs, self.factors = {}, {}

    def cov(self, i: int) -> torch.Tensor:
        if i not in self.covs:
            self.covs[i] = torch.as_tensor(
                self.stats[i].cov, dtype=torch.float64, device=self.device
            )
        return self.covs[i]

    def factor(self, i: int) -> torch.Tensor:
        if i not in self.factors:
            if self.stats[i].factor is not None:
                self.factors[i] = torch.as_tensor(
                    self.stats[i].factor, dtype=torch.float64, device=self.device
                )
            else:  # a covariance of fewer than d + 1 rows is singular: skip Cholesky
                full_rank = self.rank_bound(i) == len(self.stats[i].mean)
                self.factors[i] = sqrt_factor(self.cov(i), try_cholesky=full_rank)
        return self.factors[i]

    def rank_bound(self, i: int) -> int:
        return min(self.stats[i].n - 1, self.stats[i].mean.shape[0])


def sqrt_factor(cov: torch.Tensor, *, try_cholesky: bool = True) -> torch.Tensor:
    """A factor G with G G^T = ``cov``: Cholesky (d, d) if it succeeds, else (d, rank).

    The fallback is G = V L^1/2 over the eigenvalues above d * eps * max eigenvalue
    (smaller ones are rounding noise of a singular matrix, or negative).
    """
    if try_cholesky:
        factor, info = torch.linalg.cholesky_ex(cov)
        if int(info) == 0:
            return factor
    vals, vecs = torch.linalg.eigh(cov)
    tol = cov.shape[0] * torch.finfo(cov.dtype).eps * max(float(vals[-1]), 0.0)
    keep = vals > tol
    return vecs[:, keep] * vals[keep].sqrt()


def _root_trace(factor: torch.Tensor, cov: torch.Tensor) -> float:
    """tr (C1^1/2 C2 C1^1/2)^1/2 from C1 = factor factor^T and C2 = ``cov``.

    Eigenvalues below r * eps * max eigenvalue are rounding noise (the backward
    error of ``eigvalsh``) and count as 0: the square root would turn a noise of
    1e-16 into 1e-8 for every zero eigenvalue of a singular product.
    """
    if factor.shape[1] == 0:
        return 0.0
    inner = factor.T @ cov @ factor
    vals = torch.linalg.eigvalsh((inner + inner.T) / 2)
    tol = inner.shape[0] * torch.finfo(vals.dtype).eps * max(float(vals[-1]), 0.0)
    return float(vals[vals > tol].sqrt().sum())
