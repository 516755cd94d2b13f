"""The client sections of the consistency page (:mod:`distrank.report.html`).

:func:`client_only_section`: for a table with client rows only (a federation that never
pooled data), what the clients' scores do and do not tell about the centralized ranking,
in the words of each metric's registered :class:`~distrank.metrics.Metric`
(``agrees``, ``consistent``, ``provided``, ``pooled_from``); :func:`clients_section`:
each client's scores, and whether the clients rank the models alike.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from distrank.clients import client_weights
from distrank.metrics._metric import EXACT, NOT_GUARANTEED, SAFE
from distrank.metrics._registry import HIGHER_IS_BETTER, METRICS, spread_keys
from distrank.metrics._table import from_values
from distrank.report.markup import esc, named, section, table

__all__ = ["agrees", "client_average", "client_only_section", "clients_section"]


def agrees(metric: str) -> str:
    """What ``metric``'s registered :class:`~distrank.metrics.Metric` declares of
    ``avg`` standing in for ``all`` (``SAFE``, ``EXACT`` or ``NOT_GUARANTEED``); a key
    that is not registered is ``NOT_GUARANTEED``."""
    return METRICS[metric].agrees if metric in METRICS else NOT_GUARANTEED


def client_only_section(scores: pd.DataFrame, meta: Mapping, name) -> str:
    """What can and cannot be concluded from the client rows of a table without pooled
    ones.

    Parameters
    ----------
    scores : pandas.DataFrame
        A checked tidy score table; its ``avg`` rows, where it has them, are taken as
        they are, else computed from the ``client`` rows (:func:`client_average`).
    meta : mapping
        What ``distrank score`` records beside its table (``reference`` with each
        client's ``n``, ``options`` with ``weights``); {} when unknown.
    name : callable
        A metric key's display name on the page's features.

    Returns
    -------
    str
        The HTML section ``client-only``.
    """
    clients = scores[scores["aggregation"] == "client"]
    clients = clients[~clients["metric"].isin(spread_keys())]  # never average a spread
    if clients.empty:
        raise ValueError("scores: no 'all', 'avg' or 'client' rows to report on")
    sizes = {c: v.get("n") for c, v in (meta.get("reference") or {}).items()}
    weights = (meta.get("options") or {}).get("weights")
    avg = scores[scores["aggregation"] == "avg"]
    known_sizes = bool(sizes) and all(sizes.get(c) for c in set(clients["client"]))
    if avg.empty:
        avg = client_average(clients, sizes if known_sizes else None)
        size_weighted = known_sizes
        how = (
            "avg computed here with weights n_i/n from the recorded client sizes"
            if known_sizes
            else "avg computed here as the plain mean of the clients "
            "(client sizes not recorded: weights 1/k)"
        )
    else:
        size_weighted = weights == "size" or (weights is None and known_sizes)
        how = "avg as given in the table"
    lines = []
    for metric, rows in avg.groupby("metric", sort=False):
        order = " &gt; ".join(esc(m) for m in _ranking(rows.set_index("model")["value"], metric))
        text = _CONCLUSIONS[agrees(metric)](metric, order, name, size_weighted)
        lines.append(f'<li data-metric="{esc(metric)}">{text}</li>')
    body = (
        f"<p>This table has no pooled ('all') rows: the reference data were never "
        f"pooled. {esc(how)}.</p><ul class=conclusions>{''.join(lines)}</ul>"
    )
    return section("client-only", "What can and cannot be concluded without pooled data", body)


def client_average(clients: pd.DataFrame, sizes: Mapping | None) -> pd.DataFrame:
    """The ``avg`` rows of ``clients`` (a tidy table's ``client`` rows, no spreads): per
    model and metric, the table builder's (``metrics._table.from_values``: the metric's
    ``Metric.average``) of the clients' values with the weights n_i/n of ``sizes``
    (client -> n_i), or 1/k where ``sizes`` is None."""
    parts = []
    for (model, metric), part in clients.groupby(["model", "metric"], sort=False):
        if sizes:
            weights = client_weights([sizes[c] for c in part["client"]], "size")
        else:
            weights = client_weights(np.ones(len(part)), "uniform")
        local = {model: {metric: (None, part["value"].to_numpy(float))}}
        parts.append(from_values(local, (), weights))  # its avg row only
    return pd.concat(parts, ignore_index=True) if parts else from_values({})


def _safe(metric: str, ranking: str, name, size_weighted: bool) -> str:
    """A model-free offset: the avg ranking is the centralized one, ``all`` is not known."""
    known, shown = METRICS[metric], esc(name(metric))
    why = f" ({_words(known.consistent, name)})" if known.consistent else ""
    provided = f", provided {_words(known.provided, name)}" if known.provided else ""
    pooled = f": it needs {_words(known.pooled_from, name)}" if known.pooled_from else ""
    return (
        f"<b>{shown}</b>: the centralized ranking is known without pooling the data: it is "
        f"the avg ranking, {ranking}{why}{provided}. {shown}_all itself is not known{pooled}."
    )


def _exact(metric: str, ranking: str, name, size_weighted: bool) -> str:
    """``all`` is the size-weighted ``avg``: known once the weights are n_i/n."""
    known, shown = METRICS[metric], esc(name(metric))
    identity = (
        _words(known.consistent, name)
        if known.consistent
        else f"{shown}_all = sum_i (n_i/n) {shown}_i exactly"
    )
    return (
        f"<b>{shown}</b>: {identity}, so the pooled values are known"
        + (
            " and are the avg values: " + ranking
            if size_weighted
            else " once the client sizes n_i are known"
        )
        + "."
    )


def _not_guaranteed(metric: str, ranking: str, name, size_weighted: bool) -> str:
    """Nothing links ``avg`` to ``all``: only the avg ranking is known."""
    shown = esc(name(metric))
    pooled_from = METRICS[metric].pooled_from if metric in METRICS else ""
    return (
        f"<b>{shown}</b>: only the avg ranking ({ranking}) is known. The centralized "
        "ranking may differ"
        + (
            f": {shown}_all follows from {_words(pooled_from, name)}."
            if pooled_from
            else ", and the client scores cannot tell how."
        )
        + " Even clients that agree do not fix the pooled order (Proposition 1)."
    )


#: A metric's conclusion without pooled data, by what it declares (``Metric.agrees``).
_CONCLUSIONS = {SAFE: _safe, EXACT: _exact, NOT_GUARANTEED: _not_guaranteed}


def _words(text: str, name) -> str:
    """A metric's own text, escaped, KD and FD named as on the page's features."""
    return named(esc(text), name)


def clients_section(scores: pd.DataFrame, name) -> str:
    """Each client's scores, one table per metric, and whether the clients agree."""
    rows = scores[scores["aggregation"] == "client"]
    blocks = []
    for metric, part in rows.groupby("metric", sort=False):
        wide = part.pivot_table(
            index="model", columns="client", values="value", aggfunc="first"
        ).sort_index()
        agree = _clients_agree(wide, metric)
        blocks.append(
            f"<h3>{esc(name(metric))}</h3><p>{esc(agree)}</p>"
            + table(wide.reset_index(), metric=metric)
        )
    return section(
        "clients",
        "Each client's scores",
        "".join(blocks),
        "<details open><summary>what each client measured</summary>",
        "</details>",
    )


def _ranking(values: pd.Series, metric: str) -> list[str]:
    higher = HIGHER_IS_BETTER.get(metric, False)
    return [str(m) for m in values.sort_values(ascending=not higher, kind="mergesort").index]


def _clients_agree(wide: pd.DataFrame, metric: str) -> str:
    if len(wide) < 2 or wide.shape[1] < 2:
        return ""
    orders = {tuple(_ranking(wide[c].dropna(), metric)) for c in wide.columns}
    return (
        "Every client ranks these models alike."
        if len(orders) == 1
        else f"The clients disagree: {len(orders)} different rankings among "
        f"{wide.shape[1]} clients."
    )
