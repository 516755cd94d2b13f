"""What a metric is (:class:`Metric`), what an option is (:class:`Option`), and the
vocabulary of the options it depends on.

Torch-free (it imports only ``distrank._checks`` and ``distrank.clients``): the math
modules, the options, the families that compute the metrics and the registry all build
on it; the registered metrics are ``metrics._registry.METRICS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from distrank import clients
from distrank._checks import TooFewRows, positive_int

#: KD's estimators, on the full samples (the U- and V-statistics) or KID-style subsets.
FULL_SAMPLE_ESTIMATORS = ("unbiased", "biased")
ESTIMATORS = (*FULL_SAMPLE_ESTIMATORS, "subsets")
#: KD's kernels, and those with a bandwidth (translation-invariant, bounded in [0, 1],
#: k(x, x) = 1); ``metrics._kernels`` computes them.
KERNELS = ("poly", "rbf", "laplace", "linear")
BANDWIDTH_KERNELS = ("rbf", "laplace")

#: What may stand in for what (``avg`` ranks like ``all`` by a model-free offset, equals
#: it, or nothing is guaranteed).
SAFE, EXACT, NOT_GUARANTEED = "safe", "exact", "not guaranteed"


def check_full_sample(estimator: str, name: str = "kd_estimator", why: str = "") -> str:
    """``estimator`` if it is one of :data:`FULL_SAMPLE_ESTIMATORS`, else a ValueError
    naming ``name`` (and ``why`` the full samples are needed)."""
    if estimator not in FULL_SAMPLE_ESTIMATORS:
        raise ValueError(f"{name}: expected 'unbiased' or 'biased'{why}, got {estimator!r}")
    return estimator


@dataclass(frozen=True)
class Option:
    """One scoring option, declared once.

    It is declared by the metric that reads it (``Metric.options``) or, when several
    metrics read it, among the shared ones (``metrics._options.SHARED``);
    :class:`~distrank.metrics.ScoreOptions` is composed of them. A value is checked by
    ``check``, else against ``choices`` or, for a number, ``minimum``, else by its
    ``type``.

    Attributes
    ----------
    name
        its attribute of ``ScoreOptions`` and its key in a config's ``metrics:`` section.
    type
        ``str``, ``int``, ``float`` or ``bool`` (or the structure of a shared option the
        CLI and Flower read their own way: ``metrics``, ``kernel_params``).
    default
        the default value, which the CLI shows.
    help
        the help text the CLI shows.
    choices
        the allowed values (default ``()``: not checked against a list).
    minimum
        the least value of an ``int`` or ``float`` option (default None: no bound).
    check
        value -> the value kept, a ValueError naming the option for a bad one (default
        None: ``choices``, ``minimum`` and ``type`` check it); not compared.
    site
        whether a site needs it to score, so that a Flower request carries it (default
        True; not ``weights``: the server averages).
    key
        ``name`` with ``-`` for ``_`` (``kd-estimator``): its key in Flower's run config
        and, after ``--``, its flag of ``distrank score``.
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple = ()
    minimum: float | None = None
    check: Callable[[Any], Any] | None = field(default=None, compare=False)
    site: bool = True

    @property
    def key(self) -> str:
        """The run-config key (``kd-estimator``); ``--`` and it are the CLI's flag."""
        return self.name.replace("_", "-")

    def normalise(self, value):
        """``value`` checked (a ValueError naming the option) and as it is kept."""
        if self.check is not None:
            return self.check(value)
        if self.choices:
            if value not in self.choices:
                raise ValueError(f"{self.name}: expected one of {self.choices}, got {value!r}")
            return value
        least = -math.inf if self.minimum is None else self.minimum
        if self.type is int:
            return positive_int(value, self.name, least)
        if self.type is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{self.name}: expected a number, got {value!r}")
            if not math.isfinite(value) or value < least:
                raise ValueError(f"{self.name}: expected a finite number >= {least}, got {value!r}")
            return float(value)
        if not isinstance(value, self.type):
            raise ValueError(f"{self.name}: expected a {self.type.__name__}, got {value!r}")
        return value


@dataclass(frozen=True)
class Rows:
    """The fewest rows a client (or the pooled reference) and a model must hold, and
    what needs them: what a metric's ``needs`` returns.

    Attributes
    ----------
    client
        rows each client (and the pooled reference) must hold (default 1).
    model
        rows each model's sample must hold (default 1).
    why
        what needs them, for the error: ``"<sample> has r rows; <why> needs at least n"``.
    """

    client: int = 1
    model: int = 1
    why: str = ""


@dataclass(frozen=True)
class Metric:
    """What the package knows of a metric (module doc).

    Every ``avg`` of the package is its ``average``: the table builder's
    (``metrics._table.from_values``, ``metrics._table.averages``) and the metric's own
    batched paths (KD's bootstrap). A secure sum that adds the sites' weighted values
    (:class:`~distrank.metrics.WeightedSum`) computes the weighted mean only: a metric
    with another ``average`` needs a ``secure`` whose ``own_average`` is True (or none),
    else a ValueError.

    Attributes
    ----------
    key
        the metric's key (``kd``, ``fd``, ...).
    display
        display name, the prefix of result-table columns (``KD_all``).
    higher_is_better
        whether a higher value is a better model.
    family
        its :class:`~distrank.metrics.Family`, which computes it (several metrics may
        share one).
    needs
        a ``ScoreOptions`` -> the ``Rows`` it needs under them.
    agrees
        ``SAFE`` or ``EXACT`` when ``avg`` may stand in for ``all``, for the reason
        ``consistent``, unless an option breaks it (default ``NOT_GUARANTEED``).
    consistent
        why ``avg`` stands in for ``all`` (default "").
    why_not
        why ``avg`` need not rank like ``all`` otherwise (default "").
    breaks
        option name -> {value: why} of the option values that break ``agrees``
        (default empty).
    secure
        its :class:`~distrank.metrics.SecureSum` (default None: no secure sum).
    pooled
        its :class:`~distrank.metrics.Pooled`, how plain Flower gets its ``all`` from
        the sites' statistics (default None: it has no ``all`` there).
    provided
        what a page says without pooled data (``distrank.report``): the conditions
        under which ``avg`` stands in for ``all`` (a ``SAFE`` metric; default "").
    pooled_from
        what a page says its ``all`` needs beyond the clients' scores (default "":
        nothing the clients can share).
    spreads
        the row keys it adds that are spreads, not scores (no ``avg``, never ranked
        by; default ``()``).
    options
        the options it reads that no other family does, each an
        :class:`~distrank.metrics.Option` (metrics of one family may declare the same;
        default ``()``).
    needs_models
        False for a metric whose sites release something that scores any model later
        (a sketch): Flower sends such a run no model, and a sketch table's report reads
        the confidence of its noise (default True).
    average
        ``average(local, weights)``: its ``avg`` from the clients' values (clients on
        the last axis) and the weights lambda_i (``clients.client_weights``); default
        the weighted mean sum_i lambda_i D_i (``distrank.clients.average``).
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
    pooled: Any = field(default=None, compare=False)  # a families.Pooled, or None
    provided: str = ""
    pooled_from: str = ""
    spreads: tuple[str, ...] = ()
    options: tuple[Option, ...] = ()
    needs_models: bool = True
    average: Callable[[Any, Any], Any] = field(default=clients.average, compare=False)

    def __post_init__(self) -> None:
        own = getattr(self.secure, "own_average", False)
        if self.secure is not None and self.average is not clients.average and not own:
            raise ValueError(
                f"metric {self.key!r}: its secure sum adds the sites' weighted values (the "
                "weighted mean, clients.average), not its own average; give it a secure sum "
                "with own_average = True, or none"
            )

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


#: The package's own metrics, in the order the scorer reports them (its default).
METRIC_KEYS = ("kd", "fd", "precision", "recall", "density", "coverage")
PRDC = ("precision", "recall", "density", "coverage")


def check_names(metrics, known) -> tuple[str, ...]:
    """The requested metric names, deduplicated in order; a name or the empty selection
    that is not a subset of ``known`` is a ValueError."""
    known = tuple(known)
    if isinstance(metrics, str):
        metrics = (metrics,)
    wanted = tuple(dict.fromkeys(metrics))
    bad = [m for m in wanted if m not in known]
    if bad or not wanted:
        raise ValueError(f"metrics: expected a non-empty subset of {known}, got {tuple(metrics)!r}")
    return wanted


def check_sizes(sizes: Mapping[tuple[str, str], int], needs: Mapping[str, Rows]) -> None:
    """TooFewRows naming the sample unless every sample (``("client" or "model", name)``
    -> rows) holds the :class:`Rows` each metric needs (metric key -> Rows)."""
    for need in needs.values():
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


def prdc_rows(key: str, pr_k: int, dc_k: int) -> Rows:
    """The rows a PRDC metric needs for its k-NN radii: k + 1 in each client (precision,
    density, coverage: the reference radii) or in each model (recall)."""
    k = pr_k if key in ("precision", "recall") else dc_k
    return Rows(
        **{"model" if key == "recall" else "client": k + 1}, why=f"k={k} nearest neighbours"
    )
