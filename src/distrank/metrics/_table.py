"""The tidy score table: its columns, files, checks, the all/avg pivot and their agreement.

Every scorer of the package (``metrics.score``, ``private_scores``, the pipeline's
client and centralized score files, the Flower server) gives one table with the
columns :data:`COLUMNS`::

    model        the model's name
    metric       a metric key (``kd``, ``fd``, ..., and ``kd_std`` for KID subsets)
    aggregation  ``all`` (pooled reference), ``avg`` (sum_i lambda_i D(X_i, Y)) or
                 ``client`` (D(X_i, Y))
    client       ``str(label)`` of client i for ``client`` rows, else ``""``
    value        the score

This module reads and writes it (CSV with a ``.meta.json`` sidecar, or JSON with
``meta`` and ``scores``; its text and Markdown summaries are
:mod:`distrank.report.summary`'s), checks it, pivots it to one row per
model with its ``all`` and ``avg`` values (:func:`pivot`, :func:`wide`), and says how
well the two rankings agree: Kendall's tau-b (:func:`kendall_tau`), the model pairs
they order oppositely (:func:`discordant_pairs`, :func:`flipped_pairs`) and a table
of both per metric (:func:`rank_agreement`). Every table with per-client values is
built by :func:`from_values`, whose ``avg`` rows are each metric's own
``Metric.average`` (:func:`averages`, for a record without rows): the one place that
says what D_avg is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from distrank._checks import InputError
from distrank._io import atomic_path
from distrank.clients import average
from distrank.metrics._ranking import discordant_pairs, tau_b
from distrank.metrics._registry import HIGHER_IS_BETTER, METRICS, display, spread_keys

__all__ = [
    "AGGREGATIONS",
    "COLUMNS",
    "FORMAT",
    "FORMATS",
    "averages",
    "check",
    "flipped_pairs",
    "from_values",
    "kendall_tau",
    "keyed",
    "pivot",
    "rank_agreement",
    "read",
    "summary_taus",
    "wide",
    "write",
]

COLUMNS = ("model", "metric", "aggregation", "client", "value")
AGGREGATIONS = ("all", "avg", "client")
#: the ``format`` that ``distrank score`` records in a table's metadata
FORMAT = "distrank.scores/1"
#: file suffix -> format of :func:`write`
FORMATS = {".csv": "csv", ".json": "json", ".md": "markdown"}


def from_values(values: Mapping, client_names: Sequence[str] = (), weights=None) -> pd.DataFrame:
    """The tidy table of ``values``: model -> metric -> (pooled value or None, the
    clients' values in the order of ``client_names``[, the average]). Per model and
    metric, in that order: the ``all`` row (unless None), the ``avg`` row (the average
    given, else the metric's ``Metric.average`` of the clients' values under ``weights``;
    none for a spread such as ``kd_std``: a std of the average is not the average of
    stds, nor without client values), and one ``client`` row per client (none without
    ``client_names``). Every score table of the package is built here."""
    spreads = spread_keys()
    rows = []
    for model, by_metric in values.items():
        for metric, (pooled, local, *given) in by_metric.items():
            if pooled is not None:
                rows.append((model, metric, "all", "", float(pooled)))
            avg = given[0] if given else None
            if avg is None and len(local) and metric not in spreads:
                avg = _average(metric, local, weights)
            if avg is not None:
                rows.append((model, metric, "avg", "", float(avg)))
            rows += [(model, metric, "client", c, float(v)) for c, v in zip(client_names, local)]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def averages(values: Mapping, weights) -> dict[str, dict[str, float]]:
    """model -> metric -> ``avg`` of ``values`` (model -> metric -> the clients' values)
    under ``weights``, as :func:`from_values` makes its ``avg`` rows (a spread has none):
    what a record of the clients' averages holds (``score_files.average_client_files``)."""
    spreads = spread_keys()
    return {
        model: {
            m: _average(m, local, weights) for m, local in by_metric.items() if m not in spreads
        }
        for model, by_metric in values.items()
    }


def _average(metric: str, local, weights):
    """The registered metric's ``Metric.average`` of ``local``; an unregistered key (a
    table read from a file) the weighted mean, ``clients.average``."""
    return (METRICS[metric].average if metric in METRICS else average)(local, weights)


def check(scores: pd.DataFrame, metrics: Sequence[str] = ()) -> None:
    """Raise ``ValueError`` unless ``scores`` is a tidy score table holding ``metrics``."""
    if not isinstance(scores, pd.DataFrame):
        raise TypeError(f"scores must be a pandas DataFrame, got {type(scores).__name__}")
    missing = [c for c in COLUMNS if c not in scores.columns]
    if missing:
        raise ValueError(f"scores lacks columns {missing}; expected {list(COLUMNS)}")
    absent = sorted(set(metrics) - set(scores["metric"]))
    if absent:
        raise ValueError(
            f"scores has no rows for metric(s) {absent}; it has {sorted(set(scores['metric']))}"
        )


# ---------------------------------------------------------------------------
# all and avg side by side


def pivot(scores: pd.DataFrame, *, sort: bool = True) -> pd.DataFrame:
    """The ``all`` and ``avg`` values: one row per model (sorted by name, or in order
    of appearance with ``sort=False``), columns (metric, aggregation) with metrics in
    order of appearance, ``all`` before ``avg``; NaN where a model lacks one.

    Raises ``ValueError`` on a (model, metric, aggregation) with more than one value.
    """
    check(scores)
    pooled = scores[scores["aggregation"].isin(["all", "avg"])]
    counts = pooled.groupby(["model", "metric", "aggregation"]).size()
    if (counts > 1).any():
        raise ValueError(f"duplicate score rows: {counts[counts > 1].index.tolist()}")
    table = pooled.pivot(index="model", columns=["metric", "aggregation"], values="value")
    present = set(table.columns)
    columns = [
        (m, a) for m in dict.fromkeys(pooled["metric"]) for a in ("all", "avg") if (m, a) in present
    ]
    table = table.reindex(
        columns=pd.MultiIndex.from_tuples(columns, names=["metric", "aggregation"])
    )
    if sort:
        return table.sort_index()
    return table.reindex(list(dict.fromkeys(pooled["model"])))


def keyed(scores: pd.DataFrame) -> pd.Series:
    """The values indexed by (metric, model, key): key ``all``, ``avg`` or, for a
    ``client`` row, its client's name."""
    check(scores)
    key = np.where(scores["aggregation"] == "client", scores["client"], scores["aggregation"])
    return scores.assign(key=key).set_index(["metric", "model", "key"])["value"]


def wide(scores: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """One row per model (sorted by name), columns ``model``, then ``<Metric>_all`` and
    ``<Metric>_avg`` of each of ``metrics`` (display names).

    Raises ``ValueError`` if a (model, metric, aggregation) has no value or more than one.
    """
    check(scores, metrics)
    table = pivot(scores[scores["metric"].isin(metrics)])
    columns = [(m, a) for m in metrics for a in ("all", "avg")]
    lacking = [c for c in columns if c not in table.columns]
    if lacking:
        raise ValueError(f"scores lack (metric, aggregation) {lacking}")
    table = table[columns]
    if table.isna().any().any():
        holes = table[table.isna().any(axis=1)].index.tolist()
        raise ValueError(f"models {holes} lack an all or avg score")
    table.columns = [f"{display(m)}_{a}" for m, a in columns]
    table = table.reset_index()
    table.columns.name = None
    return table


def per_metric(scores: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """metric -> (model x [all, avg]), models sorted, for the metrics where every model
    scored by it has both."""
    table = pivot(scores)
    out = {}
    for metric in dict.fromkeys(table.columns.get_level_values("metric")):
        if (metric, "all") in table.columns and (metric, "avg") in table.columns:
            both = table[metric][["all", "avg"]].dropna(how="all")
            if not both.isna().any().any():
                both.columns.name = "aggregation"
                out[metric] = both
    return out


# ---------------------------------------------------------------------------
# How well avg ranks like all


def kendall_tau(all_values: Sequence[float], avg_values: Sequence[float]) -> tuple[float, float]:
    """(tau-b, p-value) of the ``avg`` and ``all`` scores: ``tau_b``
    and the p-value of :func:`scipy.stats.kendalltau`; NaN for fewer than two models or
    a constant column."""
    from scipy import stats

    tau = float(tau_b(avg_values, all_values))
    if len(all_values) < 2 or np.isnan(tau):
        return tau, float("nan")
    return tau, float(
        stats.kendalltau(np.asarray(avg_values, float), np.asarray(all_values, float)).pvalue
    )


def rank_agreement(wide_table: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """Kendall tau-b between the ``avg`` and ``all`` scores of the models, per metric.

    Parameters
    ----------
    wide_table
        a ``wide`` table: one row per model, with columns ``<Metric>_all`` and
        ``<Metric>_avg`` (display names) of each of ``metrics``.
    metrics
        metric keys (``kd``, ``fd``, ...), one output row each, in this order.

    Returns
    -------
    pandas.DataFrame
        columns ``metric`` (display name), ``kendall_tau``, ``p_value`` (NaN with fewer
        than two models or a constant column), ``n_models``, ``rank_flips`` (number of
        discordant model pairs).
    """
    rows = []
    for metric in metrics:
        name = display(metric)
        all_v = wide_table[f"{name}_all"].to_numpy(float)
        avg_v = wide_table[f"{name}_avg"].to_numpy(float)
        tau, p = kendall_tau(all_v, avg_v)
        rows.append(
            {
                "metric": name,
                "kendall_tau": tau,
                "p_value": p,
                "n_models": len(all_v),
                "rank_flips": len(discordant_pairs(all_v, avg_v)),
            }
        )
    return pd.DataFrame(
        rows, columns=["metric", "kendall_tau", "p_value", "n_models", "rank_flips"]
    )


def flipped_pairs(scores: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The model pairs that ``all`` and ``avg`` order differently for ``metric``.

    Columns: ``model_a`` (the better of the pair by ``all``), ``model_b`` (the better
    by ``avg``; "better" follows the metric's direction), then ``a_all``, ``b_all``,
    ``a_avg``, ``b_avg``: both models' values in both aggregations.
    """
    both = per_metric(scores)[metric]
    models, a, v = both.index.to_list(), both["all"].to_numpy(float), both["avg"].to_numpy(float)
    sign = 1.0 if HIGHER_IS_BETTER.get(metric, False) else -1.0
    rows = []
    for i, j in discordant_pairs(a, v):
        first, second = (i, j) if sign * (a[i] - a[j]) > 0 else (j, i)
        rows.append(
            {
                "model_a": models[first],
                "model_b": models[second],
                "a_all": a[first],
                "b_all": a[second],
                "a_avg": v[first],
                "b_avg": v[second],
            }
        )
    return pd.DataFrame(rows, columns=["model_a", "model_b", "a_all", "b_all", "a_avg", "b_avg"])


def summary_taus(scores: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, tuple[int, float]]]:
    """(:func:`pivot` in order of appearance, metric -> (models with both ``all`` and
    ``avg``, Kendall tau))."""
    table = pivot(scores, sort=False)
    taus = {}
    for metric in dict.fromkeys(table.columns.get_level_values("metric")):
        if (metric, "avg") in table.columns and (metric, "all") in table.columns:
            both = table[metric][["all", "avg"]].dropna()
            taus[metric] = (len(both), float(tau_b(both["avg"], both["all"])))
    return table, taus


# ---------------------------------------------------------------------------
# Files


def meta_path(path: str | os.PathLike) -> Path:
    """The metadata sidecar of a CSV table: ``<path>.meta.json``."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


def write(
    scores: pd.DataFrame, out: str | os.PathLike, meta: Mapping, fmt: str | None = None
) -> None:
    """The table as csv (+ ``<out>.meta.json``) or json (``meta`` and ``scores``),
    atomically; ``fmt`` None: from the suffix of ``out`` (:data:`FORMATS`), else csv.
    Its Markdown summary is :func:`distrank.report.summary.write_markdown`'s."""
    out = Path(out)
    fmt = fmt or FORMATS.get(out.suffix.lower(), "csv")
    if fmt == "csv":
        with atomic_path(out) as tmp, atomic_path(meta_path(out)) as tmp_meta:
            scores.to_csv(tmp, index=False)
            tmp_meta.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    elif fmt == "json":
        text = (
            json.dumps({"meta": meta, "scores": scores.to_dict(orient="records")}, indent=2) + "\n"
        )  # rows keep the table's column order
        with atomic_path(out) as tmp:
            tmp.write_text(text, encoding="utf-8")
    else:
        raise ValueError(f"fmt: expected 'csv' or 'json', got {fmt!r}")


def read(path: str | os.PathLike) -> tuple[pd.DataFrame, dict]:
    """A table written by :func:`write` (csv with optional sidecar, or json) and its
    metadata ({} if none); other tidy tables with the same columns are read too.
    A bad file raises :class:`~distrank._checks.InputError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise InputError("no such file", path=path)
    meta = {}
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or "scores" not in data:
                raise InputError(
                    "expected the JSON that 'distrank score --format json' writes, with "
                    "'meta' and 'scores'",
                    path=path,
                )
            table, meta = pd.DataFrame(data["scores"]), data.get("meta") or {}
        else:
            table = pd.read_csv(path, keep_default_na=False, dtype={"client": str})
            if meta_path(path).is_file():
                meta = json.loads(meta_path(path).read_text(encoding="utf-8"))
    except InputError:
        raise
    except (ValueError, UnicodeDecodeError) as err:  # JSON and CSV parse errors
        raise InputError(f"not a readable score table ({err})", path=path) from None
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing or table.empty:
        raise InputError(
            f"expected the columns {list(COLUMNS)} and at least one "
            f"row; {'missing ' + str(missing) if missing else 'no rows'}",
            path=path,
        )
    bad = sorted(set(table["aggregation"]) - set(AGGREGATIONS))
    if bad:
        raise InputError(f"'aggregation' must be all, avg or client; found {bad}", path=path)
    values = pd.to_numeric(table["value"], errors="coerce")
    if values.isna().any():
        line = int(np.flatnonzero(values.isna().to_numpy())[0]) + 2
        raise InputError("'value' is not a number", path=f"{path} line {line}", key="value")
    table = table.assign(value=values.astype(float), client=table["client"].astype(str))
    return table[list(COLUMNS)], meta
