"""Cross-key checks of a study config, after the schema (workflow/schemas/) has
checked each key on its own. Torch-free and Snakemake-free, so every check is a
unit test on a config dict.

    from distrank.config import check, check_file
    check_file("config.yaml")    # a key given twice in one mapping (YAML keeps the last)
    warnings = check(config)     # ValueError naming the key path, else warnings

Each check raises ``ValueError("config: <key path> ...")``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from distrank import experiments, zoo
from distrank.clients import NEEDS_LABELS
from distrank.experiments import check_partition, labelled


def check(config: Mapping) -> list[str]:
    """Run every cross-key check of ``config`` (its ``plugins:`` loaded first, so that
    their metrics are known); returns the warnings to show."""
    load_plugins(config)
    _check_registered(config)
    _check_options(config)
    _check_models(config)
    _check_sources(config)
    for key, settings in config.get("experiments", {}).items():
        experiment = experiments.get(key)
        if "partition" in settings:
            check_partition(config, f"experiments.{key}.partition", settings["partition"])
        _check_metrics(config, key, experiment)
        experiment.check(settings, config)
    _check_labels(config)
    return _warnings(config)


def check_file(path: str | os.PathLike) -> None:
    """Raise ValueError naming the file, line and key path where a mapping of the YAML
    (or JSON) config file ``path`` repeats a key: YAML loaders, Snakemake's included,
    keep the last one silently, so two models of one name would become one."""
    import yaml

    with open(path, encoding="utf-8") as handle:
        root = yaml.compose(handle, Loader=yaml.SafeLoader)
    stack = [(root, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, yaml.MappingNode):
            lines: dict = {}
            for key, value in node.value:
                line = key.start_mark.line + 1
                if key.value in lines:
                    raise ValueError(
                        f"config: {path} line {line}: {where}{key.value} is given "
                        f"twice (first on line {lines[key.value]})"
                    )
                lines[key.value] = line
                stack.append((value, f"{where}{key.value}."))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(
                (item, f"{where.removesuffix('.')}[{i}].") for i, item in enumerate(node.value)
            )


def load_plugins(config: Mapping) -> None:
    """Import every module under ``plugins:``; each registers its own metrics
    (``distrank.metrics._registry.register``). Run before :func:`check` and in every job."""
    from distrank.metrics import _registry

    try:
        _registry.load_plugins(config.get("plugins", []))
    except ValueError as err:
        raise ValueError(f"config: {err}") from None


def _check_registered(config: Mapping) -> None:
    """Every metric a config names is registered (the schema takes any name)."""
    from distrank.metrics._registry import METRICS

    named = [("metrics.metrics", config.get("metrics", {}).get("metrics") or [])]
    named += [
        (f"experiments.{key}.metrics", settings["metrics"])
        for key, settings in config.get("experiments", {}).items()
        if isinstance(settings.get("metrics"), list)
    ]
    for where, metrics in named:
        for metric in metrics:
            if metric not in METRICS:
                raise ValueError(
                    f"config: {where}: {metric!r} is not a registered metric; known: "
                    f"{sorted(METRICS)} (a module under plugins: registers more)"
                )


def _check_options(config: Mapping) -> None:
    """``metrics:`` holds scoring options (``distrank.metrics._options.specs``): the schema
    takes any other key, an option a plugin metric may declare; here each key must be
    an option of the package or of a registered metric, and each value one it takes."""
    from distrank.metrics._options import score_options

    try:
        score_options(config.get("metrics") or {})
    except ValueError as err:
        raise ValueError(f"config: metrics: {err}") from None


def _check_metrics(config: Mapping, key: str, experiment) -> None:
    """An experiment that reads the scores gets the metrics it reads."""
    scored = config.get("metrics", {}).get("metrics")
    if scored is None or experiment.scores(config["experiments"][key], config) is None:
        return
    missing = [m for m in experiment.metrics if m not in scored]
    if missing:
        raise ValueError(
            f"config: metrics.metrics is {list(scored)}, but experiments.{key} reads {missing} too"
        )


# Names of the models the experiments make (e2-G1, e5-fedavg-r01, ...): workflow/README.md.
RESERVED_MODEL = re.compile(r"e[0-9]+-")


def _check_models(config: Mapping) -> None:
    for name, spec in config["models"].items():
        if RESERVED_MODEL.match(name):
            raise ValueError(
                f"config: models.{name}: names e<n>-... are the experiments' own "
                "models (E2's e2-G1, E5's e5-fedavg-r01, ...); rename it"
            )
        kind = spec["kind"]
        if kind in zoo.FAMILIES or kind in zoo.FROM_HELDOUT:  # every other key a knob
            for key in sorted(set(spec) - {"kind"}):
                zoo.check_knob(kind, key, f"config: models.{name}.{key}")
        if kind in zoo.FAMILIES and kind not in config.get("zoo", {}):
            raise ValueError(f"config: models.{name} is a {kind}, but zoo.{kind} is not set")
        if kind in zoo.FROM_HELDOUT and "heldout" not in config:
            raise ValueError(
                f"config: models.{name} is a {kind} model, made from held-out "
                "real images, but the config has no heldout"
            )
        if kind == "images" and "max_images" in spec["source"]:
            raise ValueError(
                f"config: models.{name}.source.max_images: an images model takes "
                "the first n_samples images of its source; set n_samples instead"
            )
        if kind == "checkpoint":
            _check_artifact(config, f"models.{name}.checkpoint", spec["checkpoint"], extract=False)
            _check_artifact(config, f"models.{name}.code", spec["code"], extract=True)


def sources(config: Mapping) -> dict[str, Mapping]:
    """Every image source of the config, keyed by its key path."""
    found = {s: config[s]["source"] for s in ("reference", "heldout") if s in config}
    for name, spec in config["models"].items():
        if spec["kind"] == "images":
            found[f"models.{name}"] = spec["source"]
    return found


def _check_sources(config: Mapping) -> None:
    for where, source in sources(config).items():
        if "artifact" in source:  # a folder reads an unpacked archive, npz and cifar10 the file
            _check_artifact(
                config,
                f"{where}.source.artifact",
                source["artifact"],
                extract=source["kind"] == "folder",
            )


def _check_artifact(config: Mapping, where: str, name: str, *, extract: bool) -> None:
    downloads = config.get("downloads", {})
    if name not in downloads:
        raise ValueError(f"config: {where} is {name!r}, not one of downloads: {sorted(downloads)}")
    if downloads[name]["extract"] != extract:
        raise ValueError(
            f"config: {where} {name!r} is read "
            f"{'unpacked' if extract else 'as a file'}, so downloads.{name}.extract "
            f"must be {str(extract).lower()}"
        )


def label_needs(config: Mapping) -> list[str]:
    """The config keys that need the reference's class labels: ``reference.per_class``,
    the class partitions that experiments use, and E8 (which splits by class)."""
    needs = ["reference.per_class"] if "per_class" in config["reference"] else []
    used = {e["partition"] for e in config["experiments"].values() if "partition" in e}
    needs += [
        f"partitions.{p}" for p in sorted(used) if config["partitions"][p]["kind"] in NEEDS_LABELS
    ]
    if "E8" in config["experiments"]:
        needs.append("experiments.E8")
    return needs


def _described(config: Mapping, needs: list[str]) -> str:
    """``needs`` for a message, each partition with its kind."""
    return ", ".join(
        f"{n} ({config['partitions'][n.partition('.')[2]]['kind']})"
        if n.startswith("partitions.")
        else n
        for n in needs
    )


def _check_labels(config: Mapping) -> None:
    """What needs class labels gets a reference source that can give them, checked
    before any download; an npz (labels only if it holds arr_1) must say so."""
    source = config["reference"]["source"]
    declared = source.get("labels")
    needs = label_needs(config)
    if declared is not None and declared is not False and not labelled(source):
        raise ValueError(
            f"config: reference.source.labels is {declared!r}, but reference.source is a "
            "folder without labels_from_subfolders, which has no labels"
        )
    if not needs:
        return
    if declared is False or not labelled(source):
        why = (
            "reference.source is declared label-free (labels: false)"
            if declared is False
            else "reference.source is a folder without labels_from_subfolders"
        )
        raise ValueError(
            f"config: {_described(config, needs)} need(s) class labels, but {why}; use n "
            "and kmeans partitions"
        )
    if isinstance(declared, list) and sorted(declared) != sorted(needs):
        raise ValueError(
            f"config: reference.source.labels lists {declared}, but the keys that need "
            f"the labels are {needs}: write labels: {needs}"
        )


def _warnings(config: Mapping) -> list[str]:
    warnings = []
    checkpoints = [m for m, spec in config["models"].items() if spec["kind"] == "checkpoint"]
    if checkpoints and not config.get("trust_pickles", False):
        warnings.append(
            f"config: trust_pickles is false, so generating {', '.join(checkpoints)} will "
            "fail: loading a network pickle runs code from it. Set trust_pickles: true "
            "only for checkpoints you trust (e.g. NVIDIA's, verified by checksum)."
        )
    source = config["reference"]["source"]
    needs = label_needs(config)
    if needs and source["kind"] == "npz" and "labels" not in source:
        warnings.append(
            f"config: {_described(config, needs)} need(s) class labels, and reference.source is an "
            "npz, which has them only if it holds arr_1: declare reference.source.labels: "
            f"{needs} so that a batch without them fails as soon as it is read"
        )
    return warnings
