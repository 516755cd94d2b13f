"""The metrics: each one :class:`Metric` object, registered once, that every path asks.

A metric owns its name and display name, its direction, the rows it needs, whether
its client average ranks like its pooled value (and why: the report's verdict), how a
site's value enters a secure sum (Flower's secure mode), and its compute paths -- its
:class:`~distrank.metrics.Family`: ``plain`` (``metrics.score``), and, where
it has them, ``partitions`` (``metrics.score_partitions``) and ``resample``
(``metrics._bootstrap``); a path it lacks is taken by scoring afresh. Several metrics
may share a family (PRDC's four come from one pass).

A new metric is one file: a :class:`~distrank.metrics.Family` and a
:func:`register` call; an option of its own is an
:class:`~distrank.metrics.Option` in its ``Metric.options``, which every path then
takes (``metrics._options.ScoreOptions`` is composed of the registered metrics' options:
:func:`metric_options`; ``tests/flower/test_new_metric.py`` adds one and finds it in
every path). Torch-free, so the CLI, the config checks, the experiments and the figures
can import it cheaply; the families import torch inside their methods.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from distrank.metrics._metric import METRIC_KEYS, Metric, Option, check_names, check_sizes
from distrank.metrics.fd._family import FD_METRIC
from distrank.metrics.kd._family import KD_METRIC
from distrank.metrics.prdc._family import COVERAGE, DENSITY, PRECISION, RECALL
from distrank.metrics.sketch._family import KD_SKETCH

#: The package's metrics, in the order of ``metric.METRIC_KEYS`` (the default selection),
#: then those a caller selects by name (KD from sketches, ``kd_sketch``).
PACKAGE_METRICS = (KD_METRIC, FD_METRIC, PRECISION, RECALL, DENSITY, COVERAGE, KD_SKETCH)

#: Every registered metric by key, the package's own first (``PACKAGE_METRICS``, in the
#: order of ``metric.METRIC_KEYS``, the scorer's default), then those :func:`register` adds.
METRICS: dict[str, Metric] = {m.key: m for m in PACKAGE_METRICS}
assert tuple(METRICS)[: len(METRIC_KEYS)] == METRIC_KEYS


def register(metric: Metric) -> Metric:
    """Add ``metric`` to :data:`~distrank.metrics.METRICS`.

    Parameters
    ----------
    metric
        the :class:`~distrank.metrics.Metric` to add: its key not yet registered (a key
        may be registered once), and each option name it declares that another metric
        declares too the same :class:`~distrank.metrics.Option`.

    Returns
    -------
    Metric
        ``metric`` itself.

    Raises
    ------
    ValueError
        naming the metric: its key is registered already, or it declares an option
        otherwise than another metric does.
    """
    if metric.key in METRICS:
        raise ValueError(f"metric {metric.key!r} is registered twice")
    _merged([*METRICS.values(), metric])
    METRICS[metric.key] = metric
    return metric


def metric_options(metrics=None) -> dict[str, Option]:
    """Option name -> :class:`~distrank.metrics.Option` of ``metrics`` (the
    registered ones by default), in their order: what ``ScoreOptions`` adds to the
    shared options."""
    return _merged(METRICS.values() if metrics is None else metrics)


def _merged(metrics) -> dict[str, Option]:
    out: dict[str, Option] = {}
    for metric in metrics:
        for option in metric.options:
            if out.setdefault(option.name, option) != option:
                raise ValueError(
                    f"metric {metric.key!r}: option {option.name!r} is declared otherwise by "
                    "another metric"
                )
    return out


def unregister(key: str) -> Metric:
    """Remove a registered metric (a test's own, say); the package's are kept.

    Parameters
    ----------
    key
        the key of a metric that :func:`~distrank.metrics.register` added.

    Returns
    -------
    Metric
        the metric removed from :data:`~distrank.metrics.METRICS`.

    Raises
    ------
    ValueError
        when ``key`` is one of the package's own metrics.
    KeyError
        when no metric ``key`` is registered.
    """
    if key in {m.key for m in PACKAGE_METRICS}:
        raise ValueError(f"metric {key!r} is one of the package's own")
    return METRICS.pop(key)


def load_plugins(modules) -> None:
    """Import each of ``modules`` (names), whose import registers its own metrics with
    :func:`register`: the pipeline's ``plugins:`` (a ValueError names one that fails)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ValueError(f"plugins: cannot import {name!r} ({err})") from None


def check_metrics(metrics) -> tuple[str, ...]:
    """The requested metric names, deduplicated in order; a name or the empty
    selection that is not a registered metric is a ValueError."""
    return check_names(metrics, METRICS)


def check_rows(sizes, options) -> None:
    """TooFewRows naming the sample unless every sample (``("client" or "model", name)``
    -> rows) holds the rows each metric of ``options`` (a ``ScoreOptions``) needs."""
    check_sizes(sizes, {key: METRICS[key].needs(options) for key in options.metrics})


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


#: Display name (and prefix of result-table columns, as in ``KD_all``) of each metric.
DISPLAY: Mapping[str, str] = _Field("display")
HIGHER_IS_BETTER: Mapping[str, bool] = _Field("higher_is_better")


def spread_keys() -> frozenset[str]:
    """The row keys of every registered metric's spreads (``Metric.spreads``, KD subsets'
    ``kd_std``): no ``avg`` row (a std of the average is not the average of stds), never
    ranked by."""
    return frozenset(s for m in METRICS.values() for s in m.spreads)


def models_free(metrics) -> bool:
    """Whether ``metrics`` (keys) need no model at the sites (``Metric.needs_models``:
    sketch mode, where each site releases what scores any model later)."""
    return bool(metrics) and not any(METRICS[m].needs_models for m in metrics)


def uses_kernel(metrics) -> bool:
    """Whether any of ``metrics`` (keys) is computed with KD's kernel (its family's
    ``uses_kernel``): the scorer then builds the kernel, secure mode bounds it."""
    return any(METRICS[m].family.uses_kernel for m in metrics)


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
