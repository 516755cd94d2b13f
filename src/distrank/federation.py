"""The pipeline's privacy boundary, as file-to-file functions.

A client scores every model on its own reference features and releases a few
numbers per model (`score_client_file`); the server averages those numbers
(`average_client_files`) and never sees features. Only `score_centralized_file`
reads the pooled reference, which is what D_all needs and what a federation cannot do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from distrank._io import read_json, write_json
from distrank.clients import UNASSIGNED, client_weights, load_manifest
from distrank.metrics.registry import METRIC_KEYS

# config["metrics"] keys that are options of the scorers (the rest are aggregation choices)
_SCORER_OPTIONS = ("kernel", "kd_estimator", "pr_k", "dc_k", "dtype")


def load_features(path: str | os.PathLike, key: str = "features") -> np.ndarray:
    """The (n, d) feature matrix of an npz file; no pickle is ever loaded."""
    f = np.load(path, allow_pickle=False)
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: expected an npz archive with {key!r}, got a single array")
    with f:
        if key not in f.files:
            raise ValueError(f"{path}: no {key!r} array (has {sorted(f.files)})")
        try:
            return f[key]
        except ValueError as err:  # an object array, which only pickle could read
            raise ValueError(f"{path}: {key!r} cannot be read without pickle ({err})") from None


def client_features(reference_path, manifest_path, client: int) -> np.ndarray:
    """The reference rows that the manifest assigns to `client`."""
    owner = load_manifest(manifest_path)
    return load_features(reference_path)[owner == client]


def _scorer_options(metrics_config: Mapping) -> dict:
    return {k: metrics_config[k] for k in _SCORER_OPTIONS}


def _load_models(model_paths: Mapping) -> dict[str, np.ndarray]:
    return {name: load_features(path) for name, path in model_paths.items()}


def score_client_file(
    client_path, model_paths: Mapping, out_path, *, client: str, metrics_config: Mapping
) -> dict:
    """Score every model (name -> feature file) on one client's features; write and
    return the record: the client's row count and, per model, m and its scores."""
    from distrank.metrics.scoring import score_client

    x = load_features(client_path)
    ys = _load_models(model_paths)
    scores = score_client(x, ys, metrics=METRIC_KEYS, **_scorer_options(metrics_config))
    record = {
        "client": client,
        "n": int(len(x)),
        "models": {name: {"m": int(len(y)), "scores": scores[name]} for name, y in ys.items()},
    }
    write_json(out_path, record)
    return record


def average_client_files(paths: Iterable, out_path, *, weights: str) -> dict:
    """D_avg = sum_i lambda_i D_i for every model, from the clients' records alone."""
    paths = list(paths)
    records = [read_json(p) for p in paths]
    models = [list(r["models"]) for r in records]
    if any(m != models[0] for m in models):
        raise ValueError(f"client score files score different models: {paths}")
    lam = client_weights([r["n"] for r in records], weights)
    result = {"weights": weights, "models": {}, "clients": {}}
    for model in models[0]:
        local = [r["models"][model]["scores"] for r in records]
        result["models"][model] = {
            "scores": {m: float(sum(w * s[m] for w, s in zip(lam, local))) for m in local[0]}
        }
    for r in records:
        result["clients"][r["client"]] = {
            "n": r["n"],
            "scores": {model: v["scores"] for model, v in r["models"].items()},
        }
    write_json(out_path, result)
    return result


def score_centralized_file(
    reference_path, manifest_path, model_paths: Mapping, out_path, *, metrics_config: Mapping
) -> dict:
    """D_all: score every model against the pooled reference rows of a partition."""
    from distrank.metrics.scoring import score

    owner = load_manifest(manifest_path)
    pooled_rows = owner != UNASSIGNED
    reference, labels = load_features(reference_path)[pooled_rows], owner[pooled_rows]
    ys = _load_models(model_paths)
    table = score(
        reference,
        labels,
        ys,
        metrics=METRIC_KEYS,
        weights=metrics_config["weights"],
        **_scorer_options(metrics_config),
    )
    pooled = table[table.aggregation == "all"]
    result = {
        "n": int(len(reference)),
        "models": {name: {"m": int(len(y)), "scores": {}} for name, y in ys.items()},
    }
    for r in pooled.itertuples():
        result["models"][r.model]["scores"][r.metric] = float(r.value)
    write_json(out_path, result)
    return result


def collect(avg_path, all_path, models: Sequence[str]) -> pd.DataFrame:
    """One tidy table (model, metric, aggregation, client, value) of ``models`` from a
    partition's averaged and centralized score files."""
    avg, pooled = read_json(avg_path), read_json(all_path)
    missing = [m for m in models if m not in avg["models"] or m not in pooled["models"]]
    if missing:
        raise ValueError(f"{avg_path}, {all_path}: no scores of models {missing}")
    rows = []
    for model in models:
        rows += [(model, m, "avg", "", v) for m, v in avg["models"][model]["scores"].items()]
        for c, cr in avg["clients"].items():
            rows += [(model, m, "client", c, v) for m, v in cr["scores"][model].items()]
    for model in models:
        rows += [(model, m, "all", "", v) for m, v in pooled["models"][model]["scores"].items()]
    return pd.DataFrame(rows, columns=["model", "metric", "aggregation", "client", "value"])
