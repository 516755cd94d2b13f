"""E11's closed forms: the flip probability and the calibration of a pair's noisy gap
under isotropic sketch noise, FD from clipped moments (the ``fd_moments`` protocol) and
the bytes each protocol moves.
The derivations are in :mod:`distrank.experiments.e11_private_sketches`' module doc."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: the nominal levels of E11's calibration table
LEVELS = (0.5, 0.8, 0.9, 0.95, 0.99)


def flip_probability(gap, diff_norm, noise_std):
    """``Phi(-g / (2 sigma |v|))``: P(two models swap) under isotropic sketch noise (module
    doc)."""
    from scipy.special import ndtr

    return ndtr(-np.asarray(gap) / (2.0 * np.asarray(noise_std) * np.asarray(diff_norm)))


def calibration(noisy_gaps, gap, gap_std, levels: Sequence[float] = LEVELS) -> dict:
    """How the intervals ``noisy gap +- z_c gap_std`` (``z_c = Phi^-1((1 + c) / 2)``) of
    draws ``noisy_gaps`` (n, P) of P gaps, each ~ N(``gap``, ``gap_std``^2), measure up
    to each nominal level c of ``levels``: arrays (L, P) of ``level``, ``z``,
    ``coverage`` (the fraction of draws whose interval holds the noiseless ``gap``),
    ``coverage_se`` (the binomial standard error at the nominal level, sqrt(c (1 - c) / n)),
    ``coverage_z`` ((coverage - c) / coverage_se), ``p_resolved`` (``|noisy gap| > z_c
    gap_std``) and ``p_resolved_wrong`` (resolved with the sign opposite to ``gap``'s: at
    most (1 - c) / 2)."""
    from scipy.special import ndtri

    draws = np.atleast_2d(np.asarray(noisy_gaps, np.float64))
    gap = np.broadcast_to(np.asarray(gap, np.float64), draws.shape[1:])
    std = np.broadcast_to(np.asarray(gap_std, np.float64), draws.shape[1:])
    level = np.asarray(levels, np.float64)
    if level.ndim != 1 or not np.all((level > 0) & (level < 1)):
        raise ValueError(f"levels: expected numbers strictly between 0 and 1, got {levels!r}")
    if not np.all(np.isfinite(std) & (std > 0)):
        raise ValueError(f"gap_std: expected positive numbers, got {np.asarray(gap_std)!r}")
    n = len(draws)
    z = ndtri((1.0 + level) / 2.0)[:, None]  # (L, 1)
    half = z[..., None] * std  # (L, 1, P)
    covered = np.abs(draws - gap) <= half
    resolved = np.abs(draws) > half
    wrong = resolved & (np.sign(draws) != np.sign(gap))
    se = np.sqrt(level * (1.0 - level) / n)[:, None]
    coverage = covered.mean(axis=1)
    shape = coverage.shape
    return {
        "level": np.broadcast_to(level[:, None], shape),
        "z": np.broadcast_to(z, shape),
        "coverage": coverage,
        "coverage_se": np.broadcast_to(se, shape),
        "coverage_z": (coverage - level[:, None]) / se,
        "p_resolved": resolved.mean(axis=1),
        "p_resolved_wrong": wrong.mean(axis=1),
    }


def clip_rows(x, clip_norm: float) -> np.ndarray:
    """The rows scaled to L2 norm at most C: ``x min(1, C / |x|)``."""
    x = np.asarray(x, np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x * np.minimum(1.0, clip_norm / np.maximum(norms, np.finfo(float).tiny))


def moment_sensitivity(clip_norm: float) -> float:
    """``2 sqrt(C^2 + C^4)``: replace-one L2 sensitivity of (sum x, vec(sum x x^T)),
    ``|x| <= C``."""
    return 2.0 * math.sqrt(clip_norm**2 + clip_norm**4)


def fd_from_moments(s1, s2, n: int, models: Sequence) -> np.ndarray:
    """FD of each model (``GaussianStats``) against the Gaussian of the summed moments
    ``s1`` = sum x and ``s2`` = sum x x^T of n rows, its covariance (ddof 1) symmetrised
    and projected to PSD (``sqrt_factor`` keeps its positive
    eigenvalues)."""
    import torch

    from distrank.metrics.fd._frechet import GaussianStats, frechet_distances, sqrt_factor

    mean = np.asarray(s1) / n
    cov = (np.asarray(s2) - n * np.outer(mean, mean)) / (n - 1)
    factor = sqrt_factor(torch.as_tensor((cov + cov.T) / 2), try_cholesky=False).numpy()
    return frechet_distances([GaussianStats(n, mean, factor @ factor.T, factor)], models)[0]


def bytes_per_site(protocol: str, *, dim: int, n_features: int, model_sizes) -> tuple[int, int]:
    """(bytes sent, bytes received) by one site, 8 bytes a number: ``scores`` receives
    every model's samples at float32 and sends M numbers; ``fd_moments`` sends d(d+3)/2
    (the sum, the upper triangle of the outer products); a sketch D (the map is public)."""
    d, sizes = int(n_features), np.asarray(model_sizes)
    if protocol == "scores":
        return 8 * len(sizes), 4 * int(sizes.sum()) * d
    return 8 * (d * (d + 3) // 2 if protocol == "fd_moments" else int(dim)), 0


def threshold(n_sites: int) -> int:
    """A majority of the sites: the secure sum's unmasking threshold."""
    return n_sites // 2 + 1
