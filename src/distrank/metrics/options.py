"""The options of a scoring run: one frozen dataclass, its defaults, checked once.

:class:`ScoreOptions` is what :func:`distrank.metrics.score`,
:func:`~distrank.metrics.reaggregate.score_partitions`,
:func:`~distrank.metrics.bootstrap.bootstrap_scores` and
:func:`~distrank.metrics.privacy.private_scores` take; the ``distrank score`` command,
the Flower run config and the pipeline's ``metrics:`` section are read into it.
Its field defaults are the only place a scoring default is written (the
pipeline's schema, the Flower app's TOML and the engines below the registry -- ``kd``,
``subsets``, ``kd.resample``, ``prdc`` -- restate them; tests keep them equal).
Where the work runs (``device``) and how it is blocked (``block_size``) are not
options: they are arguments of the functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from distrank._checks import positive_int
from distrank.clients import WEIGHTS
from distrank.metrics.metric import ESTIMATORS, KERNELS, METRIC_KEYS
from distrank.metrics.registry import check_metrics

__all__ = ["DTYPES", "ESTIMATORS", "KERNELS", "WEIGHTS", "ScoreOptions", "score_options"]

#: the products' dtypes by name (``distrank._arrays.DTYPES`` maps them to torch's; not
#: imported here, so that options load without torch)
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class ScoreOptions:
    """What is computed and how: every option of a scoring run, with its default.
    Construction checks every value (a ``ValueError`` names the option).

    Attributes
    ----------
    metrics
        registered metric keys (``metrics.registry.METRICS``; default
        ``metric.METRIC_KEYS``, the package's own but ``kd_sketch``).
    kernel
        KD kernel, ``"poly"``, ``"rbf"``, ``"laplace"`` or ``"linear"``.
    kernel_params
        kernel parameters (see ``kernels.make_kernel``); an rbf/laplace
        bandwidth not given is the median heuristic on the pooled reference.
    kd_estimator
        ``"unbiased"`` (U-statistic), ``"biased"`` (V-statistic), both on
        the full samples, or ``"subsets"`` (KID: ``n_subsets`` x ``subset_size``).
    seed
        of the subsets and of the median heuristic.
    weights
        lambda_i of ``avg``: ``"size"`` (n_i / n) or ``"uniform"`` (1 / k).
    pr_k
        k of Precision and Recall.
    dc_k
        k of Density and Coverage.
    dtype
        KD and PRDC products in ``"float32"`` (sums in float64) or ``"float64"``;
        FD statistics are always float64.
    """

    metrics: tuple[str, ...] = METRIC_KEYS
    kernel: str = "poly"
    kernel_params: Mapping | None = field(default=None, hash=False)
    kd_estimator: str = "unbiased"
    n_subsets: int = 100
    subset_size: int = 1000
    seed: int = 0
    weights: str = "size"
    pr_k: int = 3
    dc_k: int = 5
    dtype: str = "float32"

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place, once
        set_(self, "metrics", check_metrics(self.metrics))
        for name, choices in (
            ("kernel", KERNELS),
            ("kd_estimator", ESTIMATORS),
            ("weights", WEIGHTS),
            ("dtype", tuple(DTYPES)),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"{name}: expected one of {choices}, got {value!r}")
        params = self.kernel_params
        if params is not None and not isinstance(params, Mapping):
            raise ValueError(f"kernel_params: expected a mapping or None, got {params!r}")
        set_(self, "kernel_params", None if params is None else dict(params))
        for name in ("n_subsets", "subset_size", "pr_k", "dc_k"):
            set_(self, name, positive_int(getattr(self, name), name))
        set_(self, "seed", positive_int(self.seed, "seed", minimum=0))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in field order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, object]:
        """Option name -> default."""
        return {f.name: f.default for f in dataclasses.fields(cls)}

    def replace(self, **changes) -> ScoreOptions:
        """A copy with ``changes`` (option names), checked."""
        _check_names(changes)
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, object]:
        """Option name -> value (``metrics`` a list, ``kernel_params`` a dict or None):
        what a metadata file or a message records."""
        out = {name: getattr(self, name) for name in self.names()}
        out["metrics"] = list(self.metrics)
        out["kernel_params"] = None if self.kernel_params is None else dict(self.kernel_params)
        return out


def score_options(options: ScoreOptions | Mapping | None = None, **changes) -> ScoreOptions:
    """``options`` (a :class:`ScoreOptions`, a mapping of option names such as the
    pipeline's ``metrics:`` section, or None for the defaults) with ``changes``."""
    if options is None:
        options = ScoreOptions()
    elif not isinstance(options, ScoreOptions):
        if not isinstance(options, Mapping):
            raise ValueError(f"options: expected ScoreOptions or a mapping, got {options!r}")
        _check_names(options)
        options = ScoreOptions(**options)
    return options.replace(**changes) if changes else options


def _check_names(names) -> None:
    unknown = sorted(set(names) - set(ScoreOptions.names()))
    if unknown:
        raise ValueError(
            f"options: unknown scoring option(s) {unknown}; known: {list(ScoreOptions.names())}"
        )
