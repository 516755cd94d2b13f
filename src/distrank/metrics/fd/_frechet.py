"""Frechet distance (FD) between Gaussian fits, with pooled statistics from client statistics.

::

    FD(N(m1, C1), N(m2, C2)) = |m1 - m2|^2 + tr C1 + tr C2 - 2 tr (C1^1/2 C2 C1^1/2)^1/2

(Dowson and Landau, "The Frechet distance between multivariate normal
distributions", J. Multivariate Anal. 1982; FID of Heusel et al., NeurIPS 2017.)

The trace term needs no matrix square root: with factors C1 = G1 G1^T and
C2 = G2 G2^T, the eigenvalues of C1^1/2 C2 C1^1/2 are the squared singular values
of X = G2^T G1, so the term is X's trace norm,

    tr (C1^1/2 C2 C1^1/2)^1/2 = sum_j sqrt(eig_j(X^T X))   (or of X X^T, the smaller),

summed over the eigenvalues above rounding noise (the others are zeros). G is the
centred rows (X - m)^T / sqrt(n - 1) when a sample has no more rows than features
(``gaussian_stats`` keeps them), else the Cholesky factor when C is positive definite,
else V L^1/2 over the positive eigenvalues of C (an ``eigh``), which drops the null
space of a rank-deficient covariance. A factor is computed once per statistics and
reused against every other; the eigenproblem's size is the lower of the two ranks.
On the CPU the factors are triangular, with zeros that X's products and Gram matrix
skip: a reference's above its diagonal (Cholesky; kept rows become R^T of a QR), a
model's below (the same with rows and columns reversed), so that X = G2^T G1 and its
Gram matrix are themselves nearly triangular: a sixth of a GEMM's flops for X of two
(d, d) factors, a third of ``syrk``'s for its Gram. Everything is float64; no
``scipy.linalg.sqrtm``.

Every factorisation and root trace runs on one BLAS/LAPACK thread, the independent ones
side by side on the job's threads (``one_thread_each``): a solve's last bits then
depend neither on the thread count nor on the process (MKL's threaded ``eigvalsh`` varies
in them from run to run at about a thousand dimensions), and the solves keep their
speed on cores that other jobs share.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from distrank._arrays import as_features, resolve_device
from distrank._blas import blas_libraries
from distrank._checks import TooFewRows
from distrank.metrics.fd._bands import (
    FULL,
    _band_of,
    _root_trace,
    _triangular,
    sqrt_factor,
)

BLOCK_SIZE = 8192  # rows per covariance update


@contextlib.contextmanager
def one_thread_each() -> Iterator[Callable[[Callable, Iterable], list]]:
    """A section in which every BLAS/LAPACK call runs on one thread, and a ``map`` that
    runs independent calls side by side on the job's threads.

    On entry, torch's intra-op thread count (the job's ``threads``: the rule's, or
    ``distrank --threads``) sizes a pool of that many workers; torch, MKL and every BLAS
    and OpenMP library that threadpoolctl finds are then held to one thread, and restored
    on exit. Each call then takes one LAPACK path on one thread, whose result is the same
    in every process and for every thread count, and the solves release the GIL, so the
    workers overlap. Inside the section (a nested one, or a worker) the pool has one worker.

    Yields
    ------
    map : callable
        ``map(fn, items)`` -> ``[fn(item) for item in items]``, in order.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with blas_libraries().limit(limits=1), ThreadPoolExecutor(threads) as pool:
            yield lambda fn, items: list(pool.map(fn, items))
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True, eq=False)
class GaussianStats:
    """Sample size, mean and covariance (ddof=1) of a feature set, in float64.

    Attributes
    ----------
    n
        int: rows of the feature set.
    mean
        numpy.ndarray, shape (d,): their mean.
    cov
        numpy.ndarray, shape (d, d), or None: their covariance, ddof=1; None when only
        the factor was asked for (``gaussian_stats(covariance=False)``).
    factor
        numpy.ndarray, shape (d, k), or None: a matrix G with G G^T = cov, the centred
        rows (X - mean)^T / sqrt(n - 1), kept when n <= d. It stays in the process: a
        Flower site shares n, mean and cov only.
    """

    n: int
    mean: np.ndarray
    cov: np.ndarray | None
    factor: np.ndarray | None = field(default=None, repr=False)


def gaussian_stats(
    x, *, device=None, block_size: int = BLOCK_SIZE, covariance: bool = True
) -> GaussianStats:
    """Mean and covariance (ddof=1) of the rows of ``x``, streamed in row blocks.

    Two passes in float64 whatever the input dtype: the mean, then the centred
    scatter (X_b - mean)^T (X_b - mean) block by block (float32 products would
    move FD by ~1e-5 relative).

    Parameters
    ----------
    x : array_like, shape (n, d)
        Features (numpy or torch, any float dtype, finite), n >= 2.
    device : str or torch.device, optional
        Where the products run (None: CUDA if available, else the CPU).
    block_size : int
        Rows of one block.
    covariance : bool
        False: no covariance where the factor is kept (n <= d; FD needs only the
        factor), ``cov`` is then None.

    Returns
    -------
    GaussianStats
        n, the mean (d,) and the covariance (d, d).

    Raises
    ------
    ValueError
        Naming ``x``: not a finite 2-d array, or fewer than 2 rows (``TooFewRows``).
    """
    x = as_features(x, "x")
    n, d = x.shape
    if n < 2:
        raise TooFewRows(f"x: {n} row; a covariance (ddof=1) needs at least 2")
    dev = resolve_device(device)
    total = torch.zeros(d, dtype=torch.float64, device=dev)
    for b0 in range(0, n, block_size):
        total += x[b0 : b0 + block_size].to(dev).sum(dim=0, dtype=torch.float64)
    mean = total / n
    if not covariance and n <= min(d, block_size):
        centred = x.to(dev, torch.float64) - mean
        return GaussianStats(n, mean.cpu().numpy(), None, _factor_of(centred, n))
    # The first block's product is the scatter (no zeros to add to): for a small client,
    # (d, d) temporaries cost more than its product.
    scatter = None
    for b0 in range(0, n, block_size):
        centred = x[b0 : b0 + block_size].to(dev, torch.float64) - mean
        product = _scatter(centred)
        scatter = product if scatter is None else scatter.add_(product)
    if dev.type != "cpu":  # syrk's scatter is exactly symmetric already
        scatter = scatter.add(scatter.T).div_(2)
    cov = scatter.div_(n - 1)
    factor = _factor_of(centred, n) if n <= min(d, block_size) else None
    return GaussianStats(n, mean.cpu().numpy(), cov.cpu().numpy(), factor)


def _factor_of(centred: torch.Tensor, n: int) -> np.ndarray:
    return (centred.T / (n - 1) ** 0.5).cpu().numpy()


def _scatter(centred: torch.Tensor) -> torch.Tensor:
    """centred^T centred; on the CPU by numpy's BLAS ``syrk`` (half a product's flops), on
    the job's threads (torch's count) whatever numpy's BLAS would take."""
    if centred.device.type != "cpu":
        return centred.T @ centred
    c = centred.numpy()
    with blas_libraries().limit(limits=torch.get_num_threads(), user_api="blas"):
        return torch.from_numpy(c.T @ c)


def pool_stats(stats: Iterable[GaussianStats]) -> GaussianStats:
    """The exact statistics of the union of the samples behind ``stats``.

    With n = sum n_i, mean = sum n_i mean_i / n and (ddof=1)

        (n - 1) C = sum_i (n_i - 1) C_i + sum_i n_i (mean_i - mean)(mean_i - mean)^T,

    the within-client plus the between-client scatter (Chan, Golub and LeVeque,
    "Algorithms for computing the sample variance", 1983).

    Parameters
    ----------
    stats : iterable of GaussianStats
        One per sample, each with its covariance, of one dimension d; an iterator is
        read once, each covariance added as it comes (memory: one (d, d) sum and the
        means).

    Returns
    -------
    GaussianStats
        n, the mean (d,) and the covariance (d, d) of the pooled rows.

    Raises
    ------
    ValueError
        When ``stats`` is empty or the dimensions differ.
    """
    sizes, means, scatter = [], [], None
    for s in stats:
        d = len(means[0]) if means else len(s.mean)
        if s.mean.shape != (d,) or s.cov.shape != (d, d):
            raise ValueError("stats: dimensions differ between the statistics")
        if scatter is None:
            scatter = (s.n - 1) * s.cov  # in place from here: (d, d) temporaries
        else:  # dominate when clients are small
            scatter += (s.n - 1) * s.cov
        sizes.append(s.n)
        means.append(s.mean)
    if scatter is None:
        raise ValueError("stats: expected at least one GaussianStats")
    n = sum(sizes)
    mean = sum(k * m for k, m in zip(sizes, means)) / n
    offsets = np.stack([m - mean for m in means])  # (k, d)
    scatter += (offsets.T * np.array(sizes, dtype=np.float64)) @ offsets
    scatter /= n - 1
    return GaussianStats(n, mean, scatter)


def frechet_distance(a: GaussianStats, b: GaussianStats, *, device=None) -> float:
    """FD between the Gaussian fits ``a`` and ``b``.

    FD = ``||m_a - m_b||^2 + tr C_a + tr C_b - 2 tr (C_a^1/2 C_b C_a^1/2)^1/2`` (Heusel
    et al., "GANs Trained by a Two Time-Scale Update Rule Converge to a Local Nash
    Equilibrium", NeurIPS 2017); the module doc says how the root is computed.

    Parameters
    ----------
    a, b : GaussianStats
        The two feature sets' statistics (:func:`gaussian_stats`), of one dimension d.
    device : str or torch.device, optional
        Where the products run (None: CUDA if available, else the CPU).

    Returns
    -------
    float
        FD(a, b).
    """
    return float(frechet_distances([a], [b], device=device)[0, 0])


@dataclass(frozen=True)
class FrechetTerms:
    """The terms of FD for every (reference, model) pair, so that FD = mean + traces - 2 root.

    Attributes
    ----------
    mean
        numpy.ndarray, shape (R, M): ``||m1 - m2||^2`` of reference r and model g.
    trace_reference, trace_model
        numpy.ndarray, shape (R, M): tr C1 and tr C2.
    root
        numpy.ndarray, shape (R, M): tr (C1^1/2 C2 C1^1/2)^1/2.
    """

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
    """FD of every (reference, model) pair: the sum of :func:`frechet_terms`.

    Parameters
    ----------
    references, models, device
        Those of :func:`frechet_terms`.

    Returns
    -------
    numpy.ndarray, shape (R, M)
        FD of reference r and model g, each bit for bit :func:`frechet_distance`'s.
    """
    return frechet_terms(references, models, device=device).fd


def frechet_terms(
    references: Sequence[GaussianStats], models: Sequence[GaussianStats], *, device=None
) -> FrechetTerms:
    """The terms of FD of every (reference, model) pair.

    Every statistics is factored once (``_Factors``) and reused for all its pairs; a
    pair then costs one product X = G_b^T G_a that skips the factors' structural zeros,
    the Gram matrix of X's smaller side and one symmetric eigenvalue problem of that size
    (:func:`_root_trace`). The factors, then the pairs (largest first), are solved side by
    side (``one_thread_each``).

    Parameters
    ----------
    references : sequence of GaussianStats, length R
    models : sequence of GaussianStats, length M
        All of one dimension d.
    device : str or torch.device, optional
        Where the products run (None: CUDA if available, else the CPU).

    Returns
    -------
    FrechetTerms
        Each term as an (R, M) array.
    """
    stats = list(references) + list(models)
    dims = {s.mean.shape[0] for s in stats}
    if len(dims) > 1:
        raise ValueError(f"stats: dimensions differ between references and models: {sorted(dims)}")
    shape = (len(references), len(models))
    mean = np.array([[float(np.sum((r.mean - m.mean) ** 2)) for m in models] for r in references])
    cache = _Factors(stats, resolve_device(device), upper=[False] * shape[0] + [True] * shape[1])
    pairs = [(r, len(references) + g) for r in range(shape[0]) for g in range(shape[1])]
    with one_thread_each() as map_:
        map_(cache.factor, range(len(stats)))  # each factor once, side by side
        order = sorted(range(len(pairs)), key=lambda p: -cache.cost(*pairs[p]))
        roots = map_(
            lambda p: _root_trace(*cache.factor(pairs[p][0]), *cache.factor(pairs[p][1])), order
        )
    root = np.empty(len(pairs))
    root[order] = roots
    traces = [_trace(s) for s in stats]
    trace_reference = np.repeat(np.array(traces[: len(references)])[:, None], shape[1], axis=1)
    trace_model = np.repeat(np.array(traces[len(references) :])[None, :], shape[0], axis=0)
    return FrechetTerms(mean, trace_reference, trace_model, root.reshape(shape))


def factored(stats: Sequence[GaussianStats], *, device=None) -> list[GaussianStats]:
    """``stats`` with their square-root factors made as models' (``_Factors``), side
    by side, and kept in place of their covariances: for models that meet many references
    in separate calls (FD's, against one client at a time)."""
    cache = _Factors(stats, resolve_device(device), upper=[True] * len(stats))

    def made(i: int) -> np.ndarray:
        g = cache.factor(i)[0]
        return g if isinstance(g, np.ndarray) else g.cpu().numpy()

    with one_thread_each() as map_:
        factors = map_(made, range(len(stats)))
    return [GaussianStats(s.n, s.mean, None, g) for s, g in zip(stats, factors)]


def _trace(s: GaussianStats) -> float:
    return float(np.trace(s.cov)) if s.cov is not None else float(np.sum(s.factor**2))


#: statistics -> (device, upper) -> (G, band), kept while the statistics live: calls that
#: meet the same statistics again (E4's settings, one model a call) factor them once.
_FACTORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Factors:
    """A square-root factor (G, band) of each of ``stats``, made once on first use: G G^T =
    cov, G numpy float64 on the CPU, else a torch tensor on ``device`` (``band`` FULL).

    On the CPU, references' factors have zeros above their diagonal (``LOWER``: Cholesky,
    or kept rows turned into R^T of a QR of G^T), models' (``upper``) the same with rows
    and columns reversed, zeros below the diagonal of their bottom block. A product G_m^T
    G_r then skips them on both sides (``bands._product``: a sixth of a GEMM's flops for two
    (d, d) factors, where two of a kind would leave a third), and so does X's Gram matrix
    (``bands._gram``). Factors made with zeros (:func:`factored`'s) are kept as they are.
    """

    def __init__(self, stats: Sequence[GaussianStats], device, upper: Sequence[bool]):
        self.stats, self.device, self.upper = stats, device, upper
        self.known = [_FACTORS.setdefault(s, {}) for s in stats]  # here: workers only read

    def factor(self, i: int) -> tuple:
        key = (self.device, self.upper[i])
        if key not in self.known[i]:
            self.known[i][key] = self._make(self.stats[i], self.upper[i])
        return self.known[i][key]

    def _make(self, s: GaussianStats, upper: bool) -> tuple:
        if s.factor is not None:
            g = torch.as_tensor(s.factor, dtype=torch.float64, device=self.device)
        else:  # a covariance of fewer than d + 1 rows is singular: skip Cholesky
            cov = torch.as_tensor(s.cov, dtype=torch.float64, device=self.device)
            g = sqrt_factor(cov, try_cholesky=s.n > len(s.mean), upper=upper)
        if self.device.type != "cpu":
            return g, FULL
        g = g.numpy()
        band = _band_of(g)
        return _triangular(g, upper) if band == FULL and s.factor is not None else (g, band)

    def cost(self, i: int, j: int) -> float:
        """The flops of the pair's root trace, roughly (its schedule's order)."""
        a, b = (self.factor(k)[0].shape[1] for k in (i, j))
        d = len(self.stats[i].mean)
        return d * a * b + min(a, b) ** 2 * max(a, b) + 10 * min(a, b) ** 3


# -- FD from moments summed with errors (secure mode) -----------------------------------


def fd_bound(pooled, model, s1: np.ndarray, e1: float, e2: float) -> float:
    """A bound on the change of FD(``pooled``, ``model``) when every entry of the summed
    first moment S1 is off by at most ``e1`` and every entry of the second, S2, by at most
    ``e2`` (FD's own rounding aside; secure mode's sums)::

        The mean moves by |dm| <= sqrt(d) e1 / n, every covariance entry by at most
        ec = (e2 + (2 e1 (max|S1| + e1) + e1^2) / n) / (n - 1), so |dC|_F <= d ec and the
        trace norm |dC|_1 <= d^1.5 ec. Then |d |m - m_Y|^2| <= 2 |m - m_Y| |dm| + 3 |dm|^2,
        |d tr C| <= d ec, and tr (C^1/2 C_Y C^1/2)^1/2 = |C^1/2 C_Y^1/2|_1 (trace norm)
        moves by at most |C'^1/2 - C^1/2|_F |C_Y^1/2|_F, where |C'^1/2 - C^1/2|_F is at
        most sqrt(2 |dC|_1) (Powers-Stormer, |A^1/2 - B^1/2|_F^2 <= |A - B|_1 for positive
        semi-definite A, B; the 2 covers FD's dropping of C''s negative part, of trace
        norm <= |dC|_1) and, when C is positive definite, |dC|_F / sqrt(lambda_min(C)).
    """
    n, d = pooled.n, pooled.mean.shape[0]
    dm = math.sqrt(d) * e1 / n
    ec = (e2 + (2 * e1 * (float(np.abs(s1).max()) + e1) + e1 * e1) / n) / (n - 1)
    gap = float(np.linalg.norm(pooled.mean - model.mean))
    spread = math.sqrt(max(float(np.trace(model.cov)), 0.0))
    root = math.sqrt(2 * d**1.5 * ec) * spread
    with one_thread_each():
        lowest = float(torch.linalg.eigvalsh(torch.as_tensor(pooled.cov, dtype=torch.float64))[0])
    smallest = lowest - d * ec  # <= lambda_min(C)
    if smallest > 0:
        root = min(root, d * ec / math.sqrt(smallest) * spread)
    return 2 * gap * dm + 3 * dm * dm + d * ec + 2 * root
