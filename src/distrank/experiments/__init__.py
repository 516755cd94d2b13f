"""Experiments: score tables (or settings) in, result tables and figures out.

Every experiment is one module here named ``e<n>_<what_it_is>.py``; the file name
is its registration: key ``E<n>``, output stem ``E<n>_<what_it_is>``
(``results/<study>/<stem><suffix>.{csv,md,tex}``, ``figures/<study>/<stem><suffix>.{pdf,png}``).
A module defines

    TABLES = ("", "_agreement")   # table suffixes (default ("",)); FIGURES likewise
    def run(inputs, settings, context) -> Outputs       # the only required function
    def check(settings, config) -> None                 # cross-key config checks
    def scores(settings, config) -> (partition, models) # what it reads from scoring
    def models(settings, config) -> {name: spec}        # image models it adds to the zoo

``inputs`` maps the names of its Snakemake rule's inputs to paths, ``settings`` is
its config section, ``context`` what every experiment may use (``extractor``,
``seed``, ``metrics``, ``models``: the names it scores). Pure functions do the
work; ``run`` only loads and calls them. This module also holds the helpers they
share, over the tidy score table of :mod:`distrank.metrics.table` (whose pivot,
rankings and all/avg agreement it re-exports): one row per model with its ranks.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from distrank.metrics.registry import HIGHER_IS_BETTER, display
from distrank.metrics.table import COLUMNS as SCORE_COLUMNS
from distrank.metrics.table import check as check_scores
from distrank.metrics.table import discordant_pairs, rank_agreement, rank_models
from distrank.metrics.table import wide as aggregates_wide

__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "Outputs",
    "get",
    "SCORE_COLUMNS",
    "check_scores",
    "aggregates_wide",
    "per_model",
    "zoo_scores",
    "collected",
    "rank_models",
    "discordant_pairs",
    "rank_agreement",
]


@dataclass
class Outputs:
    """What an experiment's ``run`` returns: tables and figures by output suffix."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, object] = field(default_factory=dict)  # matplotlib Figures


@dataclass(frozen=True)
class Experiment:
    """A registered experiment module (imported on first use)."""

    key: str
    name: str

    @property
    def stem(self) -> str:
        return f"{self.key}_{self.name}"

    @property
    def module(self):
        return importlib.import_module(f"{__name__}.{self.key.lower()}_{self.name}")

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(getattr(self.module, "TABLES", ("",)))

    @property
    def figures(self) -> tuple[str, ...]:
        return tuple(getattr(self.module, "FIGURES", ("",)))

    def check(self, settings: Mapping, config: Mapping) -> None:
        if hasattr(self.module, "check"):
            self.module.check(settings, config)

    def scores(self, settings: Mapping, config: Mapping) -> tuple[str, list[str]] | None:
        """(partition, model names) that this experiment reads from scoring, or None."""
        fn = getattr(self.module, "scores", None)
        return None if fn is None else fn(settings, config)

    def models(self, settings: Mapping, config: Mapping) -> dict[str, Mapping]:
        """Image models (name -> spec, as in config ``models``) that it adds."""
        fn = getattr(self.module, "models", None)
        return {} if fn is None else dict(fn(settings, config))

    def run(self, inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
        out = self.module.run(inputs, settings, context)
        if set(out.tables) != set(self.tables) or set(out.figures) != set(self.figures):
            raise RuntimeError(
                f"{self.key}: run returned tables {sorted(out.tables)} and "
                f"figures {sorted(out.figures)}, but declares {self.tables} "
                f"and {self.figures}"
            )
        return out

    def paths(self, results: str, figures: str) -> dict[str, str | list[str]]:
        """Its output files by name: ``table<suffix>`` (CSV, Markdown, LaTeX),
        ``pdf<suffix>`` and ``png<suffix>``."""
        paths: dict[str, str | list[str]] = {}
        for suffix in self.tables:
            paths[f"table{suffix}"] = [
                f"{results}/{self.stem}{suffix}.{ext}" for ext in ("csv", "md", "tex")
            ]
        for suffix in self.figures:
            for ext in ("pdf", "png"):
                paths[f"{ext}{suffix}"] = f"{figures}/{self.stem}{suffix}.{ext}"
        return paths

    def write(self, out: Outputs, paths: Mapping) -> None:
        """Tables as CSV, Markdown and LaTeX; figures as PDF and PNG, at ``paths``."""
        from distrank.report.figures import save
        from distrank.report.tables import write_table

        for suffix, table in out.tables.items():
            write_table(table, str(paths[f"table{suffix}"][0]).removesuffix(".csv"))
        for suffix, figure in out.figures.items():
            save(figure, str(paths[f"pdf{suffix}"]).removesuffix(".pdf"))


def zoo_scores(settings: Mapping, config: Mapping) -> tuple[str, list[str]]:
    """``scores`` of an experiment that ranks the config's whole zoo on its partition."""
    return settings["partition"], list(config["models"])


def collected(inputs: Mapping, context: Mapping) -> pd.DataFrame:
    """The tidy score table of an experiment's models, from its ``avg`` and ``all`` inputs."""
    from distrank.metrics.table import collect

    return collect(inputs["avg"], inputs["all"], context["models"])


def _discover() -> dict[str, Experiment]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        match = re.fullmatch(r"e(\d+)_(\w+)", info.name)
        if match:
            exp = Experiment(f"E{match[1]}", match[2])
            found[exp.key] = exp
    return dict(sorted(found.items(), key=lambda kv: int(kv[0][1:])))


#: Every experiment, by key, in numeric order.
EXPERIMENTS = _discover()


def get(key: str) -> Experiment:
    if key not in EXPERIMENTS:
        raise ValueError(
            f"config: experiments.{key} is not an experiment; known: {list(EXPERIMENTS)}"
        )
    return EXPERIMENTS[key]


def per_model(
    scores: pd.DataFrame, metrics: Sequence[str], *, difference: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per model and the per-metric rank agreement (:func:`rank_agreement`).

    Columns: ``model``; per metric ``<M>_all``, ``<M>_avg`` and ``<M>_gap``
    (``avg - all``, ``difference="gap"``) or ``<M>_absdiff`` (``|all - avg|``); then
    ``<M>_all_rank``, ``<M>_avg_rank`` (1 = best). Rows are sorted by model name.
    """
    if difference not in ("gap", "absdiff"):
        raise ValueError(f"difference: expected 'gap' or 'absdiff', got {difference!r}")
    wide = aggregates_wide(scores, metrics)
    names = [display(m) for m in metrics]
    table = wide[["model"]].copy()
    for name in names:
        all_, avg = wide[f"{name}_all"], wide[f"{name}_avg"]
        table[f"{name}_all"], table[f"{name}_avg"] = all_, avg
        table[f"{name}_{difference}"] = avg - all_ if difference == "gap" else (all_ - avg).abs()
    for metric, name in zip(metrics, names):
        for agg in ("all", "avg"):
            table[f"{name}_{agg}_rank"] = rank_models(
                wide[f"{name}_{agg}"], higher_is_better=HIGHER_IS_BETTER[metric]
            )
    return table, rank_agreement(wide, metrics)
