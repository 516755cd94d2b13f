"""The metrics by name: display name, direction, whether D_avg ranks like D_all, and
the function that computes them. Torch-free, so the CLI, the experiments and the
figures can import it cheaply; the scorer (``metrics.scoring``) dispatches through it.

A new metric is one :func:`register` call here, with a compute function of the
signature documented in ``metrics.scoring`` (``_score_kd`` is the example).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """What the package knows of a metric.

    ``compute`` is ``"module:function"``, imported on first use; several metrics may
    share one function (PRDC computes all four in one pass).
    """

    key: str
    display: str
    higher_is_better: bool
    consistent: str  # why D_avg ranks like D_all, or "" where it need not
    compute: str

    def function(self) -> Callable:
        module, name = self.compute.split(":")
        return getattr(importlib.import_module(module), name)


METRICS: dict[str, Metric] = {}


def register(metric: Metric) -> Metric:
    if metric.key in METRICS:
        raise ValueError(f"metric {metric.key!r} is registered twice")
    METRICS[metric.key] = metric
    return metric


_SCORING = "distrank.metrics.scoring"
for _metric in (
    Metric(
        "kd",
        "KD",
        False,
        "Theorem 1: KD_avg = KD_all + sum_i lambda_i KD(P_bar, P_i), a model-free offset",
        f"{_SCORING}:_score_kd",
    ),
    Metric("fd", "FD", False, "", f"{_SCORING}:_score_fd"),
    Metric("precision", "Precision", True, "", f"{_SCORING}:_score_prdc"),
    Metric(
        "recall",
        "Recall",
        True,
        "exact: Recall_all = sum_i (n_i / n) Recall_i (the generated manifold ignores the clients)",
        f"{_SCORING}:_score_prdc",
    ),
    Metric("density", "Density", True, "", f"{_SCORING}:_score_prdc"),
    Metric("coverage", "Coverage", True, "", f"{_SCORING}:_score_prdc"),
):
    register(_metric)

#: Every registered metric key, in registration order (the scorer's default).
METRIC_KEYS: tuple[str, ...] = tuple(METRICS)
#: Display name (and prefix of result-table columns: ``KD_all``) of each metric.
DISPLAY = {key: m.display for key, m in METRICS.items()}
HIGHER_IS_BETTER = {key: m.higher_is_better for key, m in METRICS.items()}
PRDC = ("precision", "recall", "density", "coverage")
#: Row keys beside the metrics that are spreads, not scores: no ``avg`` row (a std of
#: the average is not the average of stds), nothing ranked by them. KD subsets' std.
SPREADS = ("kd_std",)


#: KD's estimators: on the full samples (the U- and V-statistics), or KID-style subsets.
FULL_SAMPLE_ESTIMATORS = ("unbiased", "biased")
ESTIMATORS = (*FULL_SAMPLE_ESTIMATORS, "subsets")
#: KD's kernels, and those with a bandwidth: translation-invariant, bounded in [0, 1],
#: k(x, x) = 1 (``metrics.kernels`` computes them).
KERNELS = ("poly", "rbf", "laplace", "linear")
BANDWIDTH_KERNELS = ("rbf", "laplace")


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


def check_metrics(metrics, known=METRIC_KEYS) -> tuple[str, ...]:
    """The requested metric names, deduplicated in order; a name or the empty
    selection that is not a subset of ``known`` is a ValueError."""
    if isinstance(metrics, str):
        metrics = (metrics,)
    wanted = tuple(dict.fromkeys(metrics))
    bad = [m for m in wanted if m not in known]
    if bad or not wanted:
        raise ValueError(
            f"metrics: expected a non-empty subset of {tuple(known)}, got {tuple(metrics)!r}"
        )
    return wanted
