"""KD, the kernel distance (squared MMD): its kernel block sums and KD of every client
and the pool (:func:`kernel_sums`, :func:`kernel_distance`), KID-style random subsets
(:func:`subset_kd`) and a client's Gaussian release of its KD (:func:`kd_sensitivity`,
:func:`release_kd`, :func:`private_scores`, :class:`PrivacyBudget`). The modules behind
it are private; its :class:`~distrank.metrics.Metric` is ``METRICS["kd"]``. Torch-free
until a name is used.
"""

from distrank._lazy import lazy_getattr, lazy_names

_LAZY = {  # private submodule -> the names it defines
    "_sums": ("KernelSums", "kernel_sums", "kernel_distance"),
    "_subsets": ("subset_kd",),
    "_privacy": ("kd_sensitivity", "release_kd", "private_scores", "PrivacyBudget"),
}

__all__ = lazy_names(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
