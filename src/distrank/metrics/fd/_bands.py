"""Square-root factors with structural zeros, and the root trace of FD from two of them.

A factor G (C = G G^T) records where its zeros are (:class:`Band`): a reference's lie
above its diagonal (Cholesky, or kept rows made R^T of a QR), a model's below the
diagonal of its bottom block (the same with rows and columns reversed). The product
X = G_b^T G_a (:func:`_product`) and X's smaller Gram matrix (:func:`_gram`) skip every
block of columns without rows in common, and :func:`_root_sum` gives the trace norm of X
from the Gram matrix's eigenvalues: tr (C_a^1/2 C_b C_a^1/2)^1/2 (``frechet``'s module doc).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch


class Band(NamedTuple):
    """Where a factor's (or product's) column j may be nonzero: rows j + lo up to, not
    including, j + hi (within the matrix); infinite bounds for none."""

    lo: float
    hi: float

    def of_transpose(self) -> Band:
        return Band(1 - self.hi, 1 - self.lo)


FULL = Band(-math.inf, math.inf)
LOWER = Band(0, math.inf)  # zeros above the diagonal


def _upper(d: int, r: int) -> Band:
    """(d, r), r <= d: zeros below the diagonal of the bottom r x r block."""
    return Band(-math.inf, d - r + 1)


def _band_of(g: np.ndarray) -> Band:
    """LOWER or models' band if ``g`` has their zeros, else FULL (checked a block of
    columns at a time: no copy of ``g``)."""

    def zero_above(g: np.ndarray) -> bool:
        return not any(
            np.triu(g[: j + _STEP, j : j + _STEP], 1 - j).any() for j in range(0, g.shape[1], _STEP)
        )

    if zero_above(g):
        return LOWER
    return _upper(*g.shape) if zero_above(g[::-1, ::-1]) else FULL


def _triangular(g: np.ndarray, upper: bool) -> tuple[np.ndarray, Band]:
    """Kept rows G (d, r <= d) as a factor with zeros and the same G G^T: R^T of a QR of
    G^T (LOWER), or for ``upper`` that of G with its rows reversed, rows and columns
    reversed back (zeros below the diagonal of the bottom r x r block)."""
    from scipy.linalg import qr

    if not upper:
        return qr(g.T, mode="r", check_finite=False)[0].T, LOWER
    r = qr(g[::-1].T, mode="r", check_finite=False)[0]
    return np.ascontiguousarray(r[::-1, ::-1].T), _upper(*g.shape)


def sqrt_factor(
    cov: torch.Tensor, *, try_cholesky: bool = True, upper: bool = False
) -> torch.Tensor:
    """A factor G with G G^T = ``cov``: Cholesky (d, d) if it succeeds (``upper``: of
    ``cov`` with rows and columns reversed, reversed back: zeros below the diagonal),
    else (d, rank).

    The fallback is G = V L^1/2 over the eigenvalues above d * eps * max eigenvalue
    (smaller ones are rounding noise of a singular matrix, or negative).
    """
    if try_cholesky:
        flip = (lambda m: m.flip(0, 1)) if upper else (lambda m: m)
        factor, info = torch.linalg.cholesky_ex(flip(cov))
        if int(info) == 0:
            return flip(factor)
    vals, vecs = torch.linalg.eigh(cov)
    tol = cov.shape[0] * torch.finfo(cov.dtype).eps * max(float(vals[-1]), 0.0)
    keep = vals > tol
    return vecs[:, keep] * vals[keep].sqrt()


def _root_trace(ga, band_a: Band, gb, band_b: Band) -> float:
    """tr (C_a^1/2 C_b C_a^1/2)^1/2 from C_a = G_a G_a^T and C_b = G_b G_b^T: the trace
    norm of X = G_b^T G_a, i.e. the sum of the square roots of the eigenvalues of X's
    smaller Gram matrix (:func:`_root_sum`)."""
    if min(ga.shape[1], gb.shape[1]) == 0:
        return 0.0
    if not isinstance(ga, np.ndarray):
        return _root_sum(_gram(gb.T @ ga))
    return _root_sum(_gram(*_product(gb, band_b, ga, band_a)))


_STEP = 192  # columns per block of a banded side of a product or Gram matrix


def _blocks(n: int, band: Band) -> list[tuple[int, int]]:
    step = n if band == FULL else _STEP
    return [(i, min(i + step, n)) for i in range(0, n, step)]


def _product(a: np.ndarray, band_a: Band, b: np.ndarray, band_b: Band) -> tuple:
    """X = a^T b for factors a (d, p) and b (d, q), and X's band. A banded side is taken
    in column blocks of ``_STEP``; each pair of blocks meets only the rows where both
    may be nonzero, so that structural zeros cost no flops (blocks of X with none are
    set to 0)."""
    band_x = Band(band_b.lo - band_a.hi + 1, band_b.hi - band_a.lo)
    if band_a == band_b == FULL:
        return a.T @ b, band_x
    d, p, q = a.shape[0], a.shape[1], b.shape[1]
    out = np.empty((p, q))  # not zeros: memory the process holds, no fresh pages
    for i0, i1 in _blocks(p, band_a):
        for j0, j1 in _blocks(q, band_b):
            r0 = max(0, i0 + band_a.lo, j0 + band_b.lo)
            r1 = min(d, i1 - 1 + band_a.hi, j1 - 1 + band_b.hi)
            if r0 < r1:
                np.matmul(a[r0:r1, i0:i1].T, b[r0:r1, j0:j1], out=out[i0:i1, j0:j1])
            else:
                out[i0:i1, j0:j1] = 0.0
    return out, band_x


def _gram(x, band: Band = FULL):
    """The smaller Gram matrix of ``x``: x^T x or x x^T. numpy: BLAS's ``syrk`` (one
    triangle computed and mirrored, so exactly symmetric); for a banded x, the lower
    triangle (what :func:`_root_sum`'s solver reads) in blocks that meet only the rows
    where both may be nonzero, the upper set to 0."""
    if x.shape[1] > x.shape[0]:
        x, band = x.T, band.of_transpose()
    if band == FULL or not isinstance(x, np.ndarray):
        return x.T @ x
    rows, blocks = x.shape[0], _blocks(x.shape[1], band)
    out = np.empty((x.shape[1],) * 2)
    for n, (i0, i1) in enumerate(blocks):
        for j0, j1 in blocks[: n + 1]:
            r0, r1 = max(0, i0 + band.lo), min(rows, j1 - 1 + band.hi)
            xi = x[r0:r1, i0:i1]
            if r0 >= r1:
                out[i0:i1, j0:j1] = 0.0
            elif j0 == i0:
                np.matmul(xi.T, xi, out=out[i0:i1, j0:j1])
            else:
                np.matmul(xi.T, x[r0:r1, j0:j1], out=out[i0:i1, j0:j1])
        out[:i0, i0:i1] = 0.0  # the upper triangle, which the solver does not read
    return out


def _root_sum(gram) -> float:
    """Sum of the square roots of the eigenvalues of a symmetric positive semi-definite
    ``gram`` (``eigvalsh``: LAPACK's ``dsyevd``, eigenvalues only; numpy's releases the
    GIL, so that solves overlap on the job's threads, where scipy's and torch's did not).

    Eigenvalues below r * eps * max eigenvalue are rounding noise (the backward error of
    the solver) and count as 0: the square root would turn a noise of 1e-16 into 1e-8
    for every zero eigenvalue of a singular matrix.
    """
    if isinstance(gram, np.ndarray):
        vals = np.linalg.eigvalsh(gram)
    else:
        vals = torch.linalg.eigvalsh((gram + gram.T) / 2).cpu().numpy()
    tol = len(gram) * np.finfo(np.float64).eps * max(float(vals[-1]), 0.0)
    return float(np.sqrt(vals[vals > tol]).sum())
