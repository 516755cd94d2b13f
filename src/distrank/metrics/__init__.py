"""Metrics: features (and client labels) in, scores out.

KD, FD and Precision/Recall/Density/Coverage, each for the pooled reference (D_all)
and per client (averaged into D_avg), in one tidy table (:func:`score`) whose options
are one :class:`ScoreOptions`. Each metric is one :class:`Metric` in :data:`METRICS`;
a new one is a :class:`Family` and a :func:`register` call. Each family's own
functions are in its face: :mod:`distrank.metrics.kd`, :mod:`distrank.metrics.fd`,
:mod:`distrank.metrics.prdc` and :mod:`distrank.metrics.sketch`; the modules behind
them (``_name``) are private. Importing this package is torch-free: the registry
and the plugin classes load at once, everything else on first use.
"""

from distrank._lazy import lazy_getattr, lazy_names
from distrank.metrics import _registry
from distrank.metrics._family import Family, Inputs, Pooled, Run, SecureSum, WeightedSum
from distrank.metrics._metric import Metric, Option, Rows
from distrank.metrics._registry import register, unregister

#: Every registered :class:`Metric` by key: the package's own (``kd``, ``fd``,
#: ``precision``, ``recall``, ``density``, ``coverage``, then ``kd_sketch``), then those
#: :func:`register` adds.
METRICS = _registry.METRICS

_LAZY = {  # private submodule -> the names it defines
    "_scoring": ("score", "score_client", "client_scores"),
    "_options": ("ScoreOptions", "score_options"),
    "_reaggregate": ("score_partitions",),
    "_bootstrap": ("bootstrap_scores", "BootstrapScores"),
    "_table": ("rank_agreement",),
    "_kernels": ("Kernel", "make_kernel", "median_bandwidth"),
}

__all__ = [
    "METRICS",
    "Metric",
    "Option",
    "Rows",
    "Family",
    "Inputs",
    "Run",
    "Pooled",
    "SecureSum",
    "WeightedSum",
    "register",
    "unregister",
    *lazy_names(_LAZY),
]

# PEP 562: keep `import distrank.metrics` torch-free
__getattr__ = lazy_getattr(__name__, _LAZY)
