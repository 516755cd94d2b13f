"""Experiments: score tables (or settings) in, result tables and figures out.

Every experiment is one module here named ``e<n>_<what_it_is>.py`` (or a package
``e<n>_<what_it_is>/``); the name is its registration, one module a key: key ``E<n>``,
output stem ``E<n>_<what_it_is>``
(``results/<study>/<stem><suffix>.{csv,md,tex}``, ``figures/<study>/<stem><suffix>.{pdf,png}``).
A module defines

    TABLES = ("", "_agreement")   # table suffixes (default ("",)); FIGURES likewise
    METRICS = ("fd",)             # the metrics its run reads (default: all of them)
    def run(inputs, settings, context) -> Outputs       # the only required function
    def check(settings, config) -> None                 # cross-key config checks
    def scores(settings, config) -> (partition, models) # what it reads from scoring
    def models(settings, config) -> {name: spec}        # image models it adds to the zoo
    STEPS = {"e<n>_<what>": fn}                         # its pre-steps, by rule name

``inputs`` maps the names of its Snakemake rule's inputs to paths, ``settings`` is
its config section, ``context`` what every experiment may use (``extractor``,
``seed``, ``metrics``, ``models``: the names it scores). A pre-step is a rule
that makes its inputs (E2's feature-space models, E5's training, ...): ``fn(job)``
gets a :class:`Job`. ``scripts/experiment.py`` runs both (:func:`run_rule`). Pure
functions do the work; ``run`` and the steps only load and call them. This module
also holds the helpers they share.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from distrank.metrics._metric import METRIC_KEYS
from distrank.metrics._registry import DISPLAY, display

__all__ = [
    "EXPERIMENTS",
    "Experiment",
    "Outputs",
    "Job",
    "get",
    "run_rule",
    "named_on",
    "zoo_scores",
    "check_partition",
    "check_model",
    "labelled",
    "collected",
]


@dataclass
class Outputs:
    """What an experiment's ``run`` returns: tables and figures by output suffix.

    Attributes
    ----------
    tables
        dict of str to pandas.DataFrame: the tables by suffix (``""`` for the main one).
    figures
        dict of str to object: the matplotlib Figures by suffix.
    """

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, object] = field(default_factory=dict)  # matplotlib Figures


@dataclass(frozen=True)
class Job:
    """What a pre-step gets from its rule: named inputs and outputs (a path, or a list
    of paths), params, wildcards and the job's threads.

    Attributes
    ----------
    inputs, outputs
        Mapping: the rule's inputs and outputs by name, each a path or a list of paths.
    params
        Mapping: the rule's params by name.
    wildcards
        Mapping: the rule's wildcards by name (default empty).
    threads
        int: the job's threads (default 1).
    """

    inputs: Mapping
    outputs: Mapping
    params: Mapping
    wildcards: Mapping = field(default_factory=dict)
    threads: int = 1

    def args(self, *names: str) -> dict:
        """The named params as keyword arguments; ``"threads"`` is the job's threads."""
        return {n: self.threads if n == "threads" else self.params[n] for n in names}


@dataclass(frozen=True)
class Experiment:
    """A registered experiment module (imported on first use).

    Attributes
    ----------
    key
        str: ``"E<n>"``.
    name
        str: the module's name after ``e<n>_``; the output stem is ``<key>_<name>``.
    """

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

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metric keys that its run reads from scoring (``METRICS``; all by default)."""
        return tuple(getattr(self.module, "METRICS", METRIC_KEYS))

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

    @property
    def steps(self) -> dict:
        """Its pre-steps, rule name (``e<n>_...``) -> function of a :class:`Job`."""
        steps = dict(getattr(self.module, "STEPS", {}))
        prefix = f"{self.key.lower()}_"
        wrong = [name for name in steps if not name.startswith(prefix)]
        if wrong:
            raise RuntimeError(f"{self.key}: pre-step rules {wrong} must start with {prefix!r}")
        return steps

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

    def write(self, out: Outputs, paths: Mapping, extractor: str | None = None) -> None:
        """Tables as CSV, Markdown and LaTeX (their metrics named as on ``extractor``'s
        features: :func:`named_on`); figures as PDF and PNG, at ``paths``."""
        from distrank.figures import save
        from distrank.tables import write_table

        for suffix, table in out.tables.items():
            table = named_on(table, extractor)
            write_table(table, str(paths[f"table{suffix}"][0]).removesuffix(".csv"))
        for suffix, figure in out.figures.items():
            save(figure, str(paths[f"pdf{suffix}"]).removesuffix(".pdf"))


def zoo_scores(settings: Mapping, config: Mapping) -> tuple[str, list[str]]:
    """``scores`` of an experiment that ranks the config's whole zoo on its partition.

    Parameters
    ----------
    settings, config : Mapping
        The experiment's config section (with ``partition``) and the whole config.

    Returns
    -------
    tuple of (str, list of str)
        ``settings["partition"]`` and the names of ``config["models"]``.
    """
    return settings["partition"], list(config["models"])


def check_partition(config: Mapping, where: str, name: str) -> None:
    """For ``check``: raise unless ``name`` (at key path ``where``) is a partition.

    Parameters
    ----------
    config : Mapping
        The whole config.
    where : str
        The key path that gives ``name``, for the message.
    name : str
        The partition's name.

    Raises
    ------
    ValueError
        If ``name`` is not a key of ``config["partitions"]``.
    """
    if name not in config["partitions"]:
        raise ValueError(
            f"config: {where} is {name!r}, not one of partitions: {sorted(config['partitions'])}"
        )


def check_model(config: Mapping, where: str, name: str) -> None:
    """For ``check``: raise unless ``name`` (at key path ``where``) is a model.

    Parameters
    ----------
    config, where : Mapping, str
        Those of :func:`check_partition`.
    name : str
        The model's name.

    Raises
    ------
    ValueError
        If ``name`` is not a key of ``config["models"]``.
    """
    if name not in config["models"]:
        raise ValueError(
            f"config: {where} {name!r} is not one of models: {sorted(config['models'])}"
        )


def labelled(source: Mapping) -> bool:
    """False where the source surely has no labels: a folder not labelled by subfolder.

    Parameters
    ----------
    source : Mapping
        A data source's config: ``kind``, and ``labels_from_subfolders`` (default False).

    Returns
    -------
    bool
        Whether the source may have labels.
    """
    return source["kind"] != "folder" or source.get("labels_from_subfolders", False)


def collected(inputs: Mapping, context: Mapping) -> pd.DataFrame:
    """The tidy score table of an experiment's models, from its ``avg`` and ``all`` inputs.

    Parameters
    ----------
    inputs : Mapping
        The rule's inputs: ``avg`` and ``all``, the averaged and centralized score files.
    context : Mapping
        The experiment's context: ``models``, the names of the models to collect.

    Returns
    -------
    pandas.DataFrame
        The tidy table of ``collect``.
    """
    from distrank.metrics._score_files import collect

    return collect(inputs["avg"], inputs["all"], context["models"])


def _discover(path: Sequence[str] | None = None) -> dict[str, Experiment]:
    """The experiments in ``path`` (default: this package's folder) by key, in numeric
    order: every module or package named ``e<n>_<name>``; two of one key are an error."""
    found: dict[str, Experiment] = {}
    for info in pkgutil.iter_modules(__path__ if path is None else path):
        match = re.fullmatch(r"e(\d+)_(\w+)", info.name)
        if match:
            exp = Experiment(f"E{match[1]}", match[2])
            if exp.key in found:
                first = f"{exp.key.lower()}_{found[exp.key].name}"
                raise RuntimeError(
                    f"experiments: modules {first!r} and {info.name!r} both register "
                    f"{exp.key}; rename or remove one"
                )
            found[exp.key] = exp
    return dict(sorted(found.items(), key=lambda kv: int(kv[0][1:])))


#: Every experiment, by key, in numeric order.
EXPERIMENTS = _discover()


def get(key: str) -> Experiment:
    """The registered experiment of key ``key``.

    Parameters
    ----------
    key : str
        ``"E<n>"``, a key of :data:`EXPERIMENTS`.

    Returns
    -------
    Experiment
        ``EXPERIMENTS[key]``.

    Raises
    ------
    ValueError
        If no experiment is registered under ``key``.
    """
    if key not in EXPERIMENTS:
        raise ValueError(
            f"config: experiments.{key} is not an experiment; known: {list(EXPERIMENTS)}"
        )
    return EXPERIMENTS[key]


def run_rule(rule: str, job: Job) -> None:
    """Run the rule ``rule`` of the workflow: an experiment (its key: ``run``, then
    ``write`` its outputs), or one of its pre-steps (``e<n>_...``: see ``STEPS``).

    Parameters
    ----------
    rule : str
        The rule's name: an experiment's key (``"E<n>"``) or a pre-step's (``"e<n>_..."``).
    job : Job
        The rule's job; an experiment's reads ``settings`` and ``context`` from its params.

    Raises
    ------
    ValueError
        If ``rule`` is neither an experiment nor a pre-step of one.
    """
    if rule in EXPERIMENTS:
        exp, context = EXPERIMENTS[rule], job.params["context"]
        out = exp.run(job.inputs, job.params["settings"], context)
        exp.write(out, job.outputs, context["extractor"])
        return
    match = re.match(r"e(\d+)_", rule)
    steps = EXPERIMENTS[f"E{match[1]}"].steps if match and f"E{match[1]}" in EXPERIMENTS else {}
    if rule not in steps:
        raise ValueError(f"rule {rule!r} is neither an experiment nor a pre-step of one")
    steps[rule](job)


def named_on(table: pd.DataFrame, extractor: str | None) -> pd.DataFrame:
    """``table`` with its metrics named as on ``extractor``'s features
    (``display``): on Inception-v3, FD and KD columns
    (``FD_all``, ``KD_gap``) and the cells ``FD``/``KD`` (or ``fd``/``kd``) of a
    ``metric`` column become FID and KID; on any other network ``table`` is unchanged.

    Parameters
    ----------
    table : pandas.DataFrame
        A result table.
    extractor : str or None
        The feature network's name (None: no renaming).

    Returns
    -------
    pandas.DataFrame
        ``table`` itself when nothing is renamed, else a renamed copy.
    """
    names = {DISPLAY[k]: display(k, extractor) for k in ("fd", "kd")}
    names = {old: new for old, new in names.items() if new != old}
    if not names:
        return table
    pattern = re.compile(rf"^({'|'.join(names)})(?=_|$)")
    table = table.rename(columns=lambda c: pattern.sub(lambda m: names[m[1]], str(c)))
    if "metric" in table.columns:
        cells = names | {old.lower(): new for old, new in names.items()}
        table["metric"] = table["metric"].map(lambda v: cells.get(v, v))
    return table
