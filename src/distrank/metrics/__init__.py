"""Metrics: features (and client labels) in, scores out.

KD (``kd``), FD (``fd``) and Precision/Recall/Density/Coverage (``prdc``), each for
the pooled reference (D_all) and per client (averaged into D_avg), combined into
one tidy table by ``score``.
"""

from distrank.metrics.fd import (
    GaussianStats,
    frechet_distance,
    frechet_distances,
    gaussian_stats,
    pool_stats,
)
from distrank.metrics.kd import KernelSums, kd_subsets, kernel_distance, kernel_sums
from distrank.metrics.kernels import KERNELS, Kernel, make_kernel, median_bandwidth
from distrank.metrics.prdc import prdc
from distrank.metrics.scoring import METRICS, client_scores, score

__all__ = [
    "KERNELS",
    "METRICS",
    "GaussianStats",
    "Kernel",
    "KernelSums",
    "client_scores",
    "frechet_distance",
    "frechet_distances",
    "gaussian_stats",
    "kd_subsets",
    "kernel_distance",
    "kernel_sums",
    "make_kernel",
    "median_bandwidth",
    "pool_stats",
    "prdc",
    "score",
]
