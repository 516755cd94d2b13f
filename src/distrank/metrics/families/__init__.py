"""The families that compute the package's metrics, and the families' interface.

A :class:`Family` holds a group of metrics' compute paths (``base``); the package's are
KD (``kd``), FD (``fd``), PRDC's four (``prdc``) and KD from sketches (``sketch``), whose :class:`Metric` objects
:func:`register_the_package_metrics` registers. Torch-free: each family imports what
it computes with inside its methods.
"""

from distrank.metrics.families.base import (
    Family,
    Inputs,
    Partitioned,
    Run,
    SecureSum,
    Values,
    WeightedSum,
)
from distrank.metrics.families.fd import FD_METRIC
from distrank.metrics.families.kd import KD_METRIC
from distrank.metrics.families.prdc import COVERAGE, DENSITY, PRECISION, RECALL
from distrank.metrics.families.sketch import KD_SKETCH
from distrank.metrics.metric import METRIC_KEYS, METRICS, register

__all__ = ["Family", "Inputs", "Partitioned", "Run", "SecureSum", "Values", "WeightedSum"]

#: The package's metrics, in the order of ``metric.METRIC_KEYS`` (the default selection),
#: then those a caller selects by name (KD from sketches, ``kd_sketch``).
PACKAGE_METRICS = (KD_METRIC, FD_METRIC, PRECISION, RECALL, DENSITY, COVERAGE, KD_SKETCH)


def register_the_package_metrics() -> None:
    """Register the package's metrics (once)."""
    assert tuple(m.key for m in PACKAGE_METRICS[: len(METRIC_KEYS)]) == METRIC_KEYS
    for metric in PACKAGE_METRICS:
        if metric.key not in METRICS:
            register(metric)
