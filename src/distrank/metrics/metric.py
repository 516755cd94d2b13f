"""What a metric is (:class:`Metric`) and the vocabulary of the options it depends on.

Torch-free (it imports only ``distrank._checks``): the math modules, the options, the
families that compute the metrics and the registry all build on it. :data:`METRICS`
holds every registered metric (``metrics.registry`` fills it with the package's own).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from distrank._checks import TooFewRows

#: KD's estimators: on the full samples (the U- and V-statistics), or KID-style subsets.
FULL_SAMPLE_ESTIMATORS = ("unbiased", "biased")
ESTIMATORS = (*FULL_SAMPLE_ESTIMATORS, "subsets")
#: KD's kernels, and those with a bandwidth: translation-invariant, bounded in [0, 1],
#: k(x, x) = 1 (``metrics.kernels`` computes them).
KERNELS = ("poly", "rbf", "laplace", "linear")
BANDWIDTH_KERNELS = ("rbf", "laplace")
#: Row keys beside the metrics that are spreads, not scores: no ``avg`` row (a std of
#: the average is not the average of stds), nothing ranked by them. KD subsets' std.
SPREADS = ("kd_std",)

#: What may stand in for what: ``avg`` ranks like ``all`` (a model-free offset), equals
#: it, or nothing is guaranteed.
SAFE, EXACT, NOT_GUARANTEED = "safe", "exact", "not guaranteed"


@dataclass(frozen=True)
class Rows:
    """The fewest rows a client (or the pooled reference) and a model must hold, and
    what needs them (an error says ``"<sample> has r rows; <why> needs at least n"``)."""

    client: int = 1
    model: int = 1
    why: str = ""


@dataclass(frozen=True)
class Metric:
    """What the package knows of a metric (module doc).

    ``agrees`` is ``SAFE`` or ``EXACT`` when ``avg`` may stand in for ``all``, for the
    reason ``consistent``, unless an option breaks it: ``breaks`` maps an option name
    to {value: why}. ``why_not`` says why ``avg`` need not rank like ``all`` otherwise.
    ``needs`` gives the :class:`Rows` it needs under a ``ScoreOptions``; ``family`` is its
    :class:`~distrank.metrics.families.Family`, ``secure`` its
    :class:`~distrank.metrics.families.SecureSum` (None: no secure sum).
    """

    key: str
    display: str
    higher_is_better: bool
    family: Any = field(compare=False)  # a families.Family
    needs: Callable[[Any], Rows] = field(compare=False)  # of a ScoreOptions
    agrees: str = NOT_GUARANTEED
    consistent: str = ""
    why_not: str = ""
    breaks: Mapping[str, Mapping[str, str]] = field(default_factory=dict, compare=False)
    secure: Any = field(default=None, compare=False)  # a families.SecureSum, or None

    def verdict(self, options: Mapping | None) -> tuple[str, str]:
        """(``SAFE``/``EXACT``/``NOT_GUARANTEED``, why) of ``avg`` standing in for ``all``
        under ``options`` (a mapping of option names; unrecorded ones are taken as
        ``distrank score``'s defaults, and the reason says so)."""
        if self.agrees == NOT_GUARANTEED:
            return NOT_GUARANTEED, self.why_not or "no identity links avg to all"
        options = options or {}
        for name, broken in self.breaks.items():
            if options.get(name) in broken:
                return NOT_GUARANTEED, broken[options.get(name)]
        assumed = (
            "" if options.get("weights") else " (options not recorded: assuming weights n_i/n)"
        )
        return self.agrees, self.consistent + assumed


#: The package's own metrics, in the order the scorer reports them (its default);
#: ``metrics.families`` registers them in this order.
METRIC_KEYS = ("kd", "fd", "precision", "recall", "density", "coverage")
PRDC = ("precision", "recall", "density", "coverage")
METRICS: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    """Add ``metric`` to :data:`METRICS` (a key may be registered once)."""
    if metric.key in METRICS:
        raise ValueError(f"metric {metric.key!r} is registered twice")
    METRICS[metric.key] = metric
    return metric


def unregister(key: str) -> Metric:
    """Remove a registered metric (a test's own, say); the package's are kept."""
    if key in METRIC_KEYS:
        raise ValueError(f"metric {key!r} is one of the package's own")
    return METRICS.pop(key)


def check_metrics(metrics, known=None) -> tuple[str, ...]:
    """The requested metric names, deduplicated in order; a name or the empty
    selection that is not a subset of ``known`` (default: every registered metric) is
    a ValueError."""
    known = tuple(METRICS) if known is None else tuple(known)
    if isinstance(metrics, str):
        metrics = (metrics,)
    wanted = tuple(dict.fromkeys(metrics))
    bad = [m for m in wanted if m not in known]
    if bad or not wanted:
        raise ValueError(f"metrics: expected a non-empty subset of {known}, got {tuple(metrics)!r}")
    return wanted


def check_rows(sizes: Mapping[tuple[str, str], int], options) -> None:
    """TooFewRows naming the sample unless every sample (``("client" or "model", name)``
    -> rows) holds the rows each metric of ``options`` (a ``ScoreOptions``) needs."""
    for key in options.metrics:
        need = METRICS[key].needs(options)
        for (kind, name), rows in sizes.items():
            least = need.client if kind == "client" else need.model
            if rows < least:
                sample = f"clients: client {name!r}" if kind == "client" else f"models[{name!r}]"
                raise TooFewRows(
                    f"{sample} has {rows} row{'s' * (rows != 1)}; {need.why} needs at least {least}",
                    subject=(kind, name),
                )


def kd_rows(estimator: str, subset_size: int | None = None) -> Rows:
    """The rows KD's ``estimator`` needs in every sample (client, pool and model)."""
    if estimator == "subsets":
        if isinstance(subset_size, bool) or not isinstance(subset_size, int) or subset_size < 2:
            raise ValueError(f"subset_size: expected an integer >= 2, got {subset_size!r}")
        return Rows(subset_size, subset_size, f"KD subsets of subset_size={subset_size}")
    if estimator == "unbiased":
        return Rows(2, 2, "the unbiased KD (U-statistic)")
    return Rows(1, 1, "KD")
