"""The metrics: each one :class:`Metric` object, registered once, that every path asks.

A metric owns its name and display name, its direction, the rows it needs, whether
its client average ranks like its pooled value (and why: the report's verdict), how a
site's value enters a secure sum (Flower's secure mode), and its compute paths -- its
:class:`~distrank.metrics.families.Family`: ``plain`` (``metrics.score``), and, where
it has them, ``partitions`` (``metrics.score_partitions``) and ``resample``
(``metrics.bootstrap``); a path it lacks is taken by scoring afresh. Several metrics
may share a family (PRDC's four come from one pass).

A new metric is one file: a :class:`~distrank.metrics.families.Family` and a
:func:`register` call (``tests/metrics/test_new_metric.py`` adds one and finds it in
every path). Torch-free, so the CLI, the config checks, the experiments and the
figures can import it cheaply; the families import torch inside their methods.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from distrank.metrics import families
from distrank.metrics.metric import (  # noqa: F401  (what a metric is, re-exported)
    BANDWIDTH_KERNELS,
    ESTIMATORS,
    EXACT,
    FULL_SAMPLE_ESTIMATORS,
    KERNELS,
    METRIC_KEYS,
    METRICS,
    NOT_GUARANTEED,
    PRDC,
    SAFE,
    SPREADS,
    Metric,
    Rows,
    check_metrics,
    register,
    unregister,
)


class _Field(Mapping):
    """A live view of one attribute of every registered metric (metric key -> value)."""

    def __init__(self, attribute: str):
        self.attribute = attribute

    def __getitem__(self, key: str):
        return getattr(METRICS[key], self.attribute)

    def __iter__(self) -> Iterator[str]:
        return iter(METRICS)

    def __len__(self) -> int:
        return len(METRICS)


#: Display name (and prefix of result-table columns: ``KD_all``) of each metric.
DISPLAY: Mapping[str, str] = _Field("display")
HIGHER_IS_BETTER: Mapping[str, bool] = _Field("higher_is_better")

families.register_the_package_metrics()

#: Names of FD and KD on Inception-v3 features, where the literature calls them FID
#: (Heusel et al., 2017) and KID (Binkowski et al., 2018); on any other network they
#: stay FD and KD, so a number is never mistaken for one comparable with published FIDs.
INCEPTION_NAMES = {"fd": "FID", "kd": "KID"}


def display(key: str, extractor: str | None = None) -> str:
    """The display name of a metric key on ``extractor``'s features: FD/KD become
    FID/KID on Inception-v3 only. Without ``extractor``, the name that prefixes result
    table columns (``KD_all``). An unknown key is shown as it is."""
    if extractor and key in INCEPTION_NAMES and "inception" in extractor.lower():
        return INCEPTION_NAMES[key]
    return DISPLAY.get(key, key)
