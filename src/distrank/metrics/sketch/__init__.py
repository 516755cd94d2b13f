"""KD from kernel mean sketches: random Fourier features of the rbf kernel
(:class:`FeatureMap`), a site's sketch and its private release (:class:`Sketch`,
:func:`release_sketch`), KD between sketches (:func:`sketch_kd`, :func:`pool`), KID"s
cubic kernel by TensorSketch (:class:`TensorSketchMap`, :func:`tensorsketch_kd`) and a
private ranking's confidence (:func:`ranking_confidence`). The modules behind it are
private; its :class:`~distrank.metrics.Metric` is ``METRICS["kd_sketch"]``. Torch-free
until a name is used.
"""

from distrank._lazy import lazy_getattr, lazy_names

_LAZY = {  # private submodule -> the names it defines
    "_maps": ("FeatureMap", "Sketch", "release_sketch", "sketch_kd", "pool"),
    "_tensorsketch": ("TensorSketchMap", "tensorsketch_kd"),
    "_confidence": ("ranking_confidence",),
}

__all__ = lazy_names(_LAZY)

__getattr__ = lazy_getattr(__name__, _LAZY)
