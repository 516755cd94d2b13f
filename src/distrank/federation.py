"""The pipeline's privacy boundary, as file-to-file functions.

A client scores a model on its own reference features and releases a few numbers
(`score_client_file`); the server averages those numbers (`average_client_files`)
and never sees features. Only `score_centralized_file` reads the pooled reference,
which is what D_all needs and what a federation cannot do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from distrank._io import read_json, write_json
from distrank.clients import UNASSIGNED, load_manifest
from distrank.metrics import client_scores, score

METRICS = ("kd", "fd", "precision", "recall", "density", "coverage")
# config["metrics"] keys that are options of the scorers (the rest are aggregation choices)
_SCORER_OPTIONS = ("kernel", "kd_estimator", "pr_k", "dc_k", "dtype")


def load_features(path: str | os.PathLike, key: str = "features") -> np.ndarray:
    """The (n, d) feature matrix of an npz file; no pickle is ever loaded."""
    with np.load(path, allow_pickle=False) as f:
        if key not in f.files:
            raise ValueError(f"{path}: no {key!r} array (has {sorted(f.files)})")
        return f[key]


def client_features(reference_path, manifest_path, client: int) -> np.ndarray:
    """The reference rows that the manifest assigns to `client`."""
    owner = load_manifest(manifest_path)
    return load_features(reference_path)[owner == client]


def _scorer_options(metrics_config: Mapping) -> dict:
    return {k: metrics_config[k] for k in _SCORER_OPTIONS}


def score_client_file(client_path, model_path, out_path, *, model: str, client: str,
                      metrics_config: Mapping) -> dict:
    """Score one model on one client's features; write and return the record."""
    x = load_features(client_path)
    y = load_features(model_path)
    record = {
        "model": model,
        "client": client,
        "n": int(len(x)),
        "m": int(len(y)),
        "scores": client_scores(x, y, metrics=METRICS, **_scorer_options(metrics_config)),
    }
    write_json(out_path, record)
    return record


def average_client_files(paths: Iterable, out_path, *, weights: str) -> dict:
    """D_avg = sum_i lambda_i D_i from the clients' records alone.

    lambda_i = n_i / n ("size") or 1 / k ("uniform").
    """
    records = [read_json(p) for p in paths]
    models = {r["model"] for r in records}
    if len(models) != 1:
        raise ValueError(f"client score files mix models {sorted(models)}: {list(paths)}")
    n = np.array([r["n"] for r in records], dtype=float)
    lam = n / n.sum() if weights == "size" else np.full(len(n), 1 / len(n))
    metrics = records[0]["scores"].keys()
    avg = {m: float(sum(l * r["scores"][m] for l, r in zip(lam, records))) for m in metrics}
    result = {
        "model": records[0]["model"],
        "weights": weights,
        "scores": avg,
        "clients": {r["client"]: {"n": r["n"], "scores": r["scores"]} for r in records},
    }
    write_json(out_path, result)
    return result


def score_centralized_file(reference_path, manifest_path, model_path, out_path, *,
                           model: str, metrics_config: Mapping) -> dict:
    """D_all: score one model against the pooled reference rows of a partition."""
    owner = load_manifest(manifest_path)
    pooled_rows = owner != UNASSIGNED
    reference, labels = load_features(reference_path)[pooled_rows], owner[pooled_rows]
    y = load_features(model_path)
    table = score(reference, labels, {model: y}, metrics=METRICS,
                  weights=metrics_config["weights"], **_scorer_options(metrics_config))
    pooled = table[table.aggregation == "all"]
    result = {
        "model": model,
        "n": int(len(reference)),
        "m": int(len(y)),
        "scores": {r.metric: float(r.value) for r in pooled.itertuples()},
    }
    write_json(out_path, result)
    return result


def collect(avg_paths: Iterable, all_paths: Iterable) -> pd.DataFrame:
    """One tidy table (model, metric, aggregation, client, value) from score files."""
    rows = []
    for p in avg_paths:
        r = read_json(p)
        rows += [(r["model"], m, "avg", "", v) for m, v in r["scores"].items()]
        for c, cr in r["clients"].items():
            rows += [(r["model"], m, "client", c, v) for m, v in cr["scores"].items()]
    for p in all_paths:
        r = read_json(p)
        rows += [(r["model"], m, "all", "", v) for m, v in r["scores"].items()]
    return pd.DataFrame(rows, columns=["model", "metric", "aggregation", "client", "value"])
