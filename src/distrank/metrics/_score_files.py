"""The pipeline's score files: a client's record, the clients' average, the centralized
scores, and the tidy table of a partition from them.

A client job reads only its own features and the models'; the server averages the
records and never sees features; only the centralized step reads the pooled reference
(what D_all needs and a federation cannot do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from distrank._io import read_json, write_json
from distrank.metrics._table import averages, from_values

__all__ = ["average_client_files", "collect", "score_centralized_file", "score_client_file"]


def score_client_file(client_path, model_paths: Mapping, out_path, *, client: str, options) -> dict:
    """Score every model (name -> feature file) on one client's features; write and
    return the record: the client's row count and, per model, m and its scores.
    ``options``: :class:`~distrank.metrics.ScoreOptions` or a mapping of them
    (the pipeline's ``metrics:`` section)."""
    from distrank.features.cache import load_features
    from distrank.metrics._scoring import score_client

    x = load_features(client_path)
    ys = {name: load_features(path) for name, path in model_paths.items()}
    scores = score_client(x, ys, options)
    record = {
        "client": client,
        "n": int(len(x)),
        "models": {name: {"m": int(len(y)), "scores": scores[name]} for name, y in ys.items()},
    }
    write_json(out_path, record)
    return record


def average_client_files(paths: Iterable, out_path, *, weights: str) -> dict:
    """D_avg (each metric's ``Metric.average``, sum_i lambda_i D_i by default) for every
    model, from the clients' records alone."""
    from distrank.clients import client_weights

    paths = list(paths)
    records = [read_json(p) for p in paths]
    models = [list(r["models"]) for r in records]
    if any(m != models[0] for m in models):
        raise ValueError(f"client score files score different models: {paths}")
    lam = client_weights([r["n"] for r in records], weights)
    local = {}  # model -> metric -> the clients' values
    for model in models[0]:
        scores = [r["models"][model]["scores"] for r in records]
        local[model] = {m: [s[m] for s in scores] for m in scores[0]}
    result = {"weights": weights, "models": {}, "clients": {}}
    for model, avg in averages(local, lam).items():  # each metric's Metric.average
        result["models"][model] = {"scores": avg}
    for r in records:
        result["clients"][r["client"]] = {
            "n": r["n"],
            "scores": {model: v["scores"] for model, v in r["models"].items()},
        }
    write_json(out_path, result)
    return result


def score_centralized_file(
    reference_path, manifest_path, model_paths: Mapping, out_path, *, options
) -> dict:
    """D_all: score every model against the pooled reference rows of a partition (the
    pooled values only: ``scoring.pooled_of``, the clients' groups kept, as ``all`` is
    computed from them)."""
    from distrank.clients import UNASSIGNED, load_manifest
    from distrank.features.cache import load_features
    from distrank.metrics._options import score_options
    from distrank.metrics._scoring import pooled_of, prepare

    owner = load_manifest(manifest_path)
    pooled_rows = owner != UNASSIGNED
    reference, labels = load_features(reference_path)[pooled_rows], owner[pooled_rows]
    ys = {name: load_features(path) for name, path in model_paths.items()}
    pooled = pooled_of(prepare(reference, labels, ys, score_options(options)))
    result = {
        "n": int(len(reference)),
        "models": {name: {"m": int(len(y)), "scores": pooled[name]} for name, y in ys.items()},
    }
    write_json(out_path, result)
    return result


def collect(avg_path, all_path, models: Sequence[str]) -> pd.DataFrame:
    """The tidy table of ``models`` from a partition's averaged and centralized
    score files."""
    from distrank.clients import client_weights

    avg, pooled = read_json(avg_path), read_json(all_path)
    missing = [m for m in models if m not in avg["models"] or m not in pooled["models"]]
    if missing:
        raise ValueError(f"{avg_path}, {all_path}: no scores of models {missing}")
    clients = list(avg["clients"])
    weights = client_weights([avg["clients"][c]["n"] for c in clients], avg["weights"])
    values = {}
    for model in models:
        local, given = [avg["clients"][c]["scores"][model] for c in clients], avg["models"][model]
        values[model] = {
            m: (
                pooled["models"][model]["scores"].get(m),
                [s[m] for s in local],
                given["scores"].get(m),
            )
            for m in local[0]
        }
    return from_values(values, clients, weights)
