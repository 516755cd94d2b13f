"""The options of a scoring run: one frozen :class:`ScoreOptions`, composed of the shared
options (``SHARED``) and every registered metric's own (``Metric.options``), each an
:class:`~distrank.metrics.Option` declared once, checked once.

:class:`ScoreOptions` is what :func:`distrank.metrics.score`,
:func:`~distrank.metrics.score_partitions`,
:func:`~distrank.metrics.bootstrap_scores` and
:func:`~distrank.metrics.kd.private_scores` take; the ``distrank score`` command,
the Flower run config and the pipeline's ``metrics:`` section are read into it, and
their flags, keys and defaults come from the declarations (``specs``): the CLI's
flags and Flower's request keys are made from them, the Flower app's TOML, the
pipeline's schema and config.yaml are tested against them. A metric registered later
(a plugin) brings its options with it. The engines below the registry -- ``kd``,
``subsets``, ``kd._resample``, ``prdc`` -- restate some defaults (they cannot import the
options); tests keep them equal. Where the work runs (``device``) and how it is blocked
(``block_size``) are not options: they are arguments of the functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import FrozenInstanceError

from distrank.clients import WEIGHTS
from distrank.metrics._metric import ESTIMATORS, KERNELS, METRIC_KEYS, Option
from distrank.metrics._registry import PACKAGE_METRICS, check_metrics, metric_options

__all__ = [
    "DTYPES",
    "ESTIMATORS",
    "KERNELS",
    "SHARED",
    "WEIGHTS",
    "ScoreOptions",
    "score_options",
    "specs",
]

#: the products' dtypes by name (``distrank._arrays.DTYPES`` maps them to torch's; not
#: imported here, so that options load without torch)
DTYPES = ("float32", "float64")


def _kernel_params(params):
    if params is not None and not isinstance(params, Mapping):
        raise ValueError(f"kernel_params: expected a mapping or None, got {params!r}")
    return None if params is None else dict(params)  # a copy


#: The options that more than one family reads (which metrics, the kernel of KD and of
#: every family that ``uses_kernel``, the seed of KD's subsets, the median heuristic and a
#: sketch's map, the weights of ``avg`` and the products' dtype).
SHARED = (
    Option("metrics", tuple, METRIC_KEYS, "metrics to compute (default: all)", check=check_metrics),
    Option("kernel", str, "poly", "KD kernel", choices=KERNELS),
    Option(
        "kernel_params",
        dict,
        None,
        "kernel parameters (see kernels.make_kernel); an rbf/laplace bandwidth not given "
        "is the median heuristic on the pooled reference",
        check=_kernel_params,
    ),
    Option("seed", int, 0, "seed of the subsets and the median heuristic", minimum=0),
    Option(
        "weights",
        str,
        "size",
        "client weights of avg: size = n_i/n, uniform = 1/k",
        choices=WEIGHTS,
        site=False,
    ),
    Option(
        "dtype",
        str,
        "float32",
        "float32: fast products, float64 sums; float64: exact",
        choices=DTYPES,
    ),
)

#: The order in which the package has always listed its options (the CLI's flags, the
#: records of a run); an option not listed here follows them, in registration order.
LISTED = (
    "metrics",
    "kernel",
    "kernel_params",
    "kd_estimator",
    "n_subsets",
    "subset_size",
    "seed",
    "weights",
    "pr_k",
    "dc_k",
    "dtype",
)


def specs(metrics=None) -> dict[str, Option]:
    """Option name -> :class:`~distrank.metrics.Option`: the shared ones and those
    of ``metrics`` (every registered metric by default; ``registry.PACKAGE_METRICS``: the
    package's alone), in :data:`LISTED` order, then the others'. A metric's option named
    like a shared one is a ValueError."""
    shared = {o.name: o for o in SHARED}
    own = metric_options(metrics)
    clash = sorted(set(shared) & set(own))
    if clash:
        raise ValueError(f"options: {clash} are shared options; a metric cannot declare them")
    merged = shared | own
    order = [n for n in LISTED if n in merged] + [n for n in merged if n not in LISTED]
    return {name: merged[name] for name in order}


def package_specs() -> dict[str, Option]:
    """``specs`` of the package's own metrics (what its TOML and schema declare)."""
    return specs(PACKAGE_METRICS)


class ScoreOptions:
    """What is computed and how: every option of a scoring run (``specs``), with its
    default. Construction checks every value (a ``ValueError`` names the option); an
    option is read as an attribute (``options.kd_estimator``), never set.

    The package's options (``help`` of each ``SHARED`` option and ``Metric.options``):
    ``metrics`` (registered metric keys; default ``metric.METRIC_KEYS``, the package's own
    but ``kd_sketch``), ``kernel``, ``kernel_params``, ``seed``, ``weights`` (lambda_i of
    ``avg``), ``dtype`` (KD and PRDC products; FD statistics are always float64); KD's
    ``kd_estimator``, ``n_subsets``, ``subset_size``; PRDC's ``pr_k`` and ``dc_k``.

    Parameters
    ----------
    **values
        Option name -> value; an option not given takes its default. An unknown name is
        a ``TypeError``, a bad value a ``ValueError`` naming the option.
    """

    def __init__(self, **values) -> None:
        known = specs()
        for name in values:
            if name not in known:
                raise TypeError(
                    f"ScoreOptions.__init__() got an unexpected keyword argument {name!r}"
                )
        self._set(known, values, None)

    def _set(self, known: Mapping, changes: Mapping, kept) -> None:
        """Each option of ``known`` as an attribute: its change checked, else as ``kept``
        has it (a ScoreOptions, already checked), else its default checked."""
        for name, option in known.items():
            if name in changes:
                value = option.normalise(changes[name])
            elif kept is not None and name in vars(kept):
                value = vars(kept)[name]
            else:
                value = option.normalise(option.default)
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str):  # a name that is not an attribute
        option = specs().get(name)  # an option registered after these were made: its default
        if option is None:
            raise AttributeError(f"'ScoreOptions' object has no attribute {name!r}")
        return option.normalise(option.default)

    def __setattr__(self, name: str, value) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _items(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.names()}

    def __eq__(self, other) -> bool:
        if not isinstance(other, ScoreOptions):
            return NotImplemented
        return self._items() == other._items()

    def __hash__(self) -> int:
        return hash(tuple((n, v) for n, v in self._items().items() if n != "kernel_params"))

    def __repr__(self) -> str:
        return f"ScoreOptions({', '.join(f'{n}={v!r}' for n, v in self._items().items())})"

    def __reduce__(self):
        return _made, (dict(vars(self)),)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in ``specs`` order."""
        return tuple(specs())

    @classmethod
    def defaults(cls) -> dict[str, object]:
        """Option name -> default."""
        return {name: option.default for name, option in specs().items()}

    def replace(self, **changes) -> ScoreOptions:
        """A copy with ``changes`` (option names), each checked (the others already are)."""
        return _made(changes, self)

    def as_dict(self) -> dict[str, object]:
        """Option name -> value (``metrics`` a list, ``kernel_params`` a dict or None):
        what a metadata file or a message records."""
        out = self._items()
        out["metrics"] = list(self.metrics)
        out["kernel_params"] = None if self.kernel_params is None else dict(self.kernel_params)
        return out


def _made(values: Mapping, kept=None) -> ScoreOptions:
    """The options ``values`` (names; a ValueError names one unknown), the others as
    ``kept`` (a ScoreOptions) has them or their defaults, each checked once."""
    known = specs()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"options: unknown scoring option(s) {unknown}; known: {list(known)}")
    made = object.__new__(ScoreOptions)
    made._set(known, values, kept)
    return made


def score_options(options: ScoreOptions | Mapping | None = None, **changes) -> ScoreOptions:
    """Options with changes, each value checked once.

    Parameters
    ----------
    options : ScoreOptions, mapping or None
        A mapping of option names such as the pipeline's ``metrics:`` section; None:
        the defaults.
    **changes
        Option names as keywords, which win over ``options``.

    Returns
    -------
    ScoreOptions

    Raises
    ------
    ValueError
        Naming the option and the value.
    """
    if options is None:
        return _made(changes)
    if not isinstance(options, ScoreOptions):
        if not isinstance(options, Mapping):
            raise ValueError(f"options: expected ScoreOptions or a mapping, got {options!r}")
        return _made({**options, **changes})
    return options.replace(**changes) if changes else options
