"""Metrics: features (and client labels) in, scores out.

KD (``kd``), FD (``fd``) and Precision/Recall/Density/Coverage (``prdc``), each for
the pooled reference (D_all) and per client (averaged into D_avg), combined into
one tidy table (``table``) by ``score``, whose options are one ``ScoreOptions``
(``options``). ``registry`` names them (torch-free); everything else imports torch
on first use.
"""

from distrank._lazy import lazy_getattr
from distrank.metrics.registry import METRICS

_LAZY = {
    "GaussianStats": "fd.frechet",
    "frechet_distance": "fd.frechet",
    "frechet_distances": "fd.frechet",
    "FrechetTerms": "fd.frechet",
    "frechet_terms": "fd.frechet",
    "gaussian_stats": "fd.frechet",
    "pool_stats": "fd.frechet",
    "KernelSums": "kd.sums",
    "kernel_distance": "kd.sums",
    "kernel_sums": "kd.sums",
    "KERNELS": "kernels",
    "Kernel": "kernels",
    "make_kernel": "kernels",
    "median_bandwidth": "kernels",
    "ScoreOptions": "options",
    "score_options": "options",
    "client_scores": "scoring",
    "score": "scoring",
    "score_client": "scoring",
}

__all__ = ["METRICS", *_LAZY]


# PEP 562: keep `import distrank.metrics.registry` torch-free
__getattr__ = lazy_getattr(__name__, _LAZY)
