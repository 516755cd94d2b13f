"""FD, the Fréchet distance of Gaussian fits: Gaussian statistics and their pooling
(:func:`gaussian_stats`, :func:`pool_stats`), FD and its terms (:func:`frechet_distance`,
:func:`frechet_terms`) and FD of many partitions of one reference (:func:`partition_fds`).
The modules behind it are private; its :class:`~distrank.metrics.Metric` is
``METRICS["fd"]``. Torch-free until a name is used.
"""

from distrank._lazy import lazy_getattr, lazy_names

_LAZY = {  # private submodule -> the names it defines
    "_frechet": (
        "GaussianStats",
        "gaussian_stats",
        "pool_stats",
        "frechet_distance",
        "frechet_distances",
        "FrechetTerms",
        "frechet_terms",
    ),
    "_partitions": ("partition_fds",),
}

__all__ = lazy_names(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
