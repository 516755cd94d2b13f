"""Metrics: features (and client labels) in, scores out.

KD (``kd``), FD (``fd``) and Precision/Recall/Density/Coverage (``prdc``), each for
the pooled reference (D_all) and per client (averaged into D_avg), combined into
one tidy table (``table``) by ``score``, whose options are one ``ScoreOptions``
(``options``). ``registry`` names them (torch-free); everything else imports torch
on first use.
"""

from distrank._lazy import lazy_getattr, lazy_names
from distrank.metrics.registry import METRICS

_LAZY = {  # submodule -> the names it defines
    "fd.frechet": (
        "GaussianStats",
        "frechet_distance",
        "frechet_distances",
        "FrechetTerms",
        "frechet_terms",
        "gaussian_stats",
        "pool_stats",
    ),
    "kd.sums": ("KernelSums", "kernel_distance", "kernel_sums"),
    "kernels": ("KERNELS", "Kernel", "make_kernel", "median_bandwidth"),
    "options": ("ScoreOptions", "score_options"),
    "scoring": ("client_scores", "score", "score_client"),
}

__all__ = ["METRICS", *lazy_names(_LAZY)]


# PEP 562: keep `import distrank.metrics.registry` torch-free
__getattr__ = lazy_getattr(__name__, _LAZY)
