"""Precision, Recall, Density and Coverage: one blocked pass over the distance blocks
(:func:`prdc`) and many partitions of one reference (:func:`partition_prdc`). The modules
behind it are private; its four :class:`~distrank.metrics.Metric` objects are
``METRICS["precision"]`` to ``METRICS["coverage"]``. Torch-free until a name is used.
"""

from distrank._lazy import lazy_getattr, lazy_names

_LAZY = {  # private submodule -> the names it defines
    "_scores": ("prdc",),
    "_partitions": ("partition_prdc",),
}

__all__ = lazy_names(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
