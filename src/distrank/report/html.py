r"""One self-contained HTML page on a score table: may the clients' average be trusted?

``distrank report scores.csv --out report.html`` (:func:`write_report`) reads a tidy
score table (``model, metric, aggregation, client, value``; aggregation ``all``,
``avg`` or ``client``) and writes one page, figures embedded as PNG data URIs, no
script, no network, that says for the user's own models:

- the ``all`` (pooled reference) and ``avg`` (:math:`\sum_i \lambda_i D(X_i, Y)`)
  value and rank of every model, per metric;
- which metrics are safe to average across clients, and why
  (:mod:`distrank.report.verdicts`):
  KD by Theorem 1 of Wang et al. (arXiv 2310.11714),
  :math:`\mathrm{KD_{avg}} = \mathrm{KD_{all}} + \sum_i \lambda_i \mathrm{KD}(\bar P, P_i)`,
  a gap that does not depend on the model when :math:`\lambda_i = n_i / n` and the
  estimator uses the full samples (the page shows the gap and how much it varies);
  Recall exactly, :math:`\mathrm{Recall_{all}} = \sum_i (n_i / n)\,\mathrm{Recall}_i`;
  FD, Precision, Density and Coverage not (Theorem 2, Proposition 1; Naeem et al.);
- the model pairs that ``all`` and ``avg`` order differently, and Kendall's tau-b
  between the two rankings, per metric (:func:`~distrank.metrics.rank_agreement`);
- the E1 and E6 figures of the pipeline, drawn for these models;
- for a table with client rows only (a federation that never pooled data), what
  the clients' scores do and do not tell about the centralized ranking;
- for a private ranking (``distrank rank``, ``distrank score --private``), the privacy
  parameters, every adjacent pair the noise leaves unresolved and the ranks those pairs
  tie (:mod:`distrank.report.privacy`).

Numbers are shown to four significant digits (the table keeps every digit), and a
difference within float rounding of the scores it is taken from as such.

Options the table was computed with (client weights, KD estimator, client sizes,
extractor) come from the metadata ``distrank score`` writes beside it; without
them the page says which conclusions depend on them.

This module holds the pooled sections; the client sections are
:mod:`distrank.report.client_sections`', the markup :mod:`distrank.report.markup`'s.
What the page says of a metric comes from its registered
:class:`~distrank.metrics.Metric` (``agrees``, ``consistent``, ``provided``,
``pooled_from``, ``spreads``), never from its key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import pandas as pd

from distrank._io import atomic_write_bytes
from distrank.figures import e1_figure, e1_table, e6_figure, e6_table
from distrank.metrics._metric import EXACT, PRDC, SAFE
from distrank.metrics._ranking import rank_models
from distrank.metrics._registry import HIGHER_IS_BETTER, display, spread_keys
from distrank.metrics._table import COLUMNS, check, flipped_pairs, per_metric
from distrank.report.client_sections import agrees, client_only_section, clients_section
from distrank.report.markup import difference, esc, figure, named, num, page, section, tau
from distrank.report.privacy import (
    noisy_metric,
    privacy_facts,
    privacy_section,
    private_values_section,
    tied_ranks,
    unresolved,
)
from distrank.report.verdicts import consistency

__all__ = ["build_report", "write_report"]


def write_report(scores: pd.DataFrame, out: str | os.PathLike, **options) -> Path:
    """Write :func:`build_report`'s page to ``out`` atomically; returns the path."""
    return atomic_write_bytes(out, build_report(scores, **options).encode("utf-8"))


def build_report(
    scores: pd.DataFrame,
    *,
    meta: Mapping | None = None,
    extractor: str | None = None,
    title: str | None = None,
    source: str | os.PathLike | None = None,
) -> str:
    """The page (an HTML string) for a tidy score table.

    Parameters
    ----------
    scores : pandas.DataFrame
        A tidy score table (``model, metric, aggregation, client, value``).
    meta : mapping, optional
        What ``distrank score`` records beside its table (``options`` with ``weights``
        and ``kd_estimator``; ``reference`` with each client's ``n``); None or {} when
        unknown.
    extractor : str, optional
        The feature network, named on the figures' axes.
    title : str, optional
        The page title (default: from ``source``).
    source : str or path, optional
        The table's file.

    Returns
    -------
    str
        The self-contained HTML page.
    """
    scores = _check(scores)
    meta = dict(meta or {})
    extractor = extractor or meta.get("extractor") or "unknown"
    title = title or (
        f"Consistency report: {Path(source).name}" if source else "Consistency report"
    )
    pooled = {"all", "avg"} <= set(scores["aggregation"])
    name = partial(display, extractor=extractor)  # FID/KID on Inception, as on the figures
    body = [_header(title, scores, meta, extractor, source, name)]
    if pooled:
        body += [
            _values_section(scores, name, meta),
            privacy_section(meta),
            _consistency_section(scores, meta, name),
            _flips_section(scores, name),
            _figures_section(scores, extractor),
        ]
    elif meta.get("confidence"):  # score --private: the noise decides what the avg tells
        body += [private_values_section(scores, meta, name), privacy_section(meta)]
    else:
        body.append(client_only_section(scores, meta, name))
    if (scores["aggregation"] == "client").any():
        body.append(clients_section(scores, name))
    return page(title, "\n".join(body))


# ---------------------------------------------------------------------------
# Sections


def _header(title, scores, meta, extractor, source, name) -> str:
    models = scores["model"].unique()
    clients = sorted(set(scores.loc[scores["aggregation"] == "client", "client"]))
    options = meta.get("options") or {}
    facts = [
        ("models", f"{len(models)}: {', '.join(map(str, models))}"),
        ("metrics", ", ".join(name(m) for m in scores["metric"].unique())),
        ("clients", str(len(clients)) if clients else "no client rows"),
        ("features", extractor),
    ]
    if source:
        facts.insert(0, ("score table", str(source)))
    if options:
        facts.append(
            ("options", ", ".join(f"{k}={v}" for k, v in sorted(options.items()) if k != "metrics"))
        )
    else:
        facts.append(("options", "not recorded (no metadata beside the table)"))
    facts += privacy_facts(meta)
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    return f'<header><h1>{esc(title)}</h1><dl class="facts">{items}</dl></header>'


def _values_section(scores, name, meta) -> str:
    by_metric = per_metric(scores)
    arrows = {m: "&uarr;" if HIGHER_IS_BETTER.get(m, False) else "&darr;" for m in by_metric}
    head = "".join(f"<th class=num>{esc(name(m))} {arrows[m]}</th>" for m in by_metric)
    ranks = {
        (m, agg): dict(
            zip(w.index, rank_models(w[agg], higher_is_better=HIGHER_IS_BETTER.get(m, False)))
        )
        for m, w in by_metric.items()
        for agg in ("all", "avg")
    }
    noisy = noisy_metric(meta)
    for agg in ("all", "avg"):  # models its noise does not separate tie
        if noisy in by_metric:
            ranks[(noisy, agg)] |= tied_ranks(meta, agg)
    rows = []
    for model in sorted(set().union(*(w.index for w in by_metric.values()))):
        for agg in ("all", "avg"):  # stacked, so the table is as wide as the metrics
            cells = [f"<td rowspan=2>{esc(model)}</td>"] if agg == "all" else []
            cells.append(f"<td class=agg>{agg}</td>")
            for metric, wide in by_metric.items():
                if model not in wide.index:  # this metric was not computed for this model
                    cells.append("<td class=num>n/a</td>")
                    continue
                cells.append(
                    f'<td class=num data-model="{esc(model)}" data-metric="{esc(metric)}" '
                    f'data-aggregation="{agg}">{num(wide.at[model, agg])} <span class=rank>'
                    f"({ranks[(metric, agg)][model]})</span></td>"
                )
            rows.append(f'<tr class="{agg}">{"".join(cells)}</tr>')
    body = (
        f'<table class="values"><thead><tr><th>model</th><th></th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    return section(
        "values",
        "Scores per model: all and avg",
        body,
        "<p><b>all</b>: each model against the pooled reference (centralized). "
        "<b>avg</b>: the clients' scores averaged with their weights. In "
        "parentheses: the model's rank, 1 = best; &darr; lower is better, "
        "&uarr; higher is better. Four significant digits; the score table keeps "
        "every digit.</p>",
    )


def _consistency_section(scores, meta, name) -> str:
    rows, noisy = [], noisy_metric(meta) if unresolved(meta) else None
    for r in consistency(scores, meta).itertuples():
        verdict_class = "ok" if r.verdict in ("safe", "exact") else "warn"
        if r.metric == noisy:  # the noise, not the averaging, decides
            verdict_class = "warn"
            r = r._replace(verdict=f"{r.verdict} to average; the noise leaves pairs unresolved")
        measured = "<br>".join(_measured(r, name))
        rows.append(
            f'<tr data-metric="{esc(r.metric)}"><td>{esc(name(r.metric))}</td>'
            f'<td class="{verdict_class} verdict">{esc(r.verdict)}</td>'
            f"<td>{esc(named(r.why, name))}</td><td class=measured>{measured}</td>"
            f'<td class="num tau">{tau(r.kendall_tau)}</td></tr>'
        )
    body = (
        '<table class="consistency"><thead><tr><th>metric</th><th>safe to average?</th>'
        "<th>why</th><th>measured on these models</th><th>Kendall tau (avg vs all)</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    return section(
        "consistency",
        "Which metrics are safe to average across clients",
        body,
        "<p>A metric is safe to average when ranking by avg is ranking by all, for "
        "every set of models, by a theorem rather than by luck. Kendall tau is 1 "
        "when both rankings agree on every pair. A difference within float rounding of "
        "the scores it is taken from is shown as such.</p>",
    )


def _measured(r, name) -> list[str]:
    """The lines of a :func:`consistency` row's "measured on these models" cell, by what
    its metric declares (``Metric.agrees``): a model-free offset's gap and whether it is
    constant (``SAFE``), the largest difference (``EXACT``), or the gap (otherwise)."""
    gap = partial(difference, rounding=r.rounding)
    flips = f"{r.rank_flips} flipped pair{'s' * (r.rank_flips != 1)}"
    declared = agrees(r.metric)
    if declared == SAFE:
        shown = esc(name(r.metric))
        constant = "constant" if r.gap_constant else "<b>varies across models</b>"
        return [
            f"gap {shown}_avg - {shown}_all: <span class=gap>{gap(r.gap_mean)}</span> (mean)",
            f"max - min: {gap(r.gap_range)}, {constant}",
            flips,
        ]
    if declared == EXACT:
        return [f"max |avg - all|: {gap(r.max_absdiff)}", flips]
    return [f"gap avg - all: {gap(r.gap_mean)} (mean)", f"max - min: {gap(r.gap_range)}", flips]


def _flips_section(scores, name) -> str:
    items = []
    for metric in per_metric(scores):
        pairs, shown = flipped_pairs(scores, metric), name(metric)
        if pairs.empty:
            items.append(
                f'<li data-metric="{esc(metric)}" data-flips="0"><b>{esc(shown)}</b>: '
                "no pair flips; all and avg rank these models alike.</li>"
            )
            continue
        flips = "".join(
            f"<li><b>{esc(p.model_a)}</b> is better than <b>{esc(p.model_b)}</b> by {esc(shown)}_all "
            f"({num(p.a_all)} against {num(p.b_all)}), worse by {esc(shown)}_avg "
            f"({num(p.a_avg)} against {num(p.b_avg)})</li>"
            for p in pairs.itertuples()
        )
        items.append(
            f'<li data-metric="{esc(metric)}" data-flips="{len(pairs)}"><b>{esc(shown)}'
            f"</b>: {len(pairs)} flipped pair{'s' * (len(pairs) != 1)}<ul>{flips}</ul></li>"
        )
    return section(
        "flips",
        "Where avg and all disagree: model pairs that flip",
        f"<ul class=flips>{''.join(items)}</ul>",
    )


def _figures_section(scores, extractor) -> str:
    name = partial(display, extractor=extractor)
    blocks = []
    metrics = set(per_metric(scores))
    if {"kd", "fd"} <= metrics:
        table, _ = e1_table(scores)
        blocks.append(
            figure(
                e1_figure(table, extractor),
                "E1",
                named(
                    "KD_avg against KD_all (left): one line of slope 1, the gap of "
                    "Theorem 1. FD (right): pairs whose order flips are joined in red.",
                    name,
                ),
            )
        )
    else:
        blocks.append(named("<p>The E1 figure needs KD and FD in both aggregations.</p>", name))
    if set(PRDC) <= metrics:
        table, _ = e6_table(scores)
        blocks.append(
            figure(
                e6_figure(table, extractor),
                "E6",
                "Precision, Recall, Density and Coverage, avg against all; "
                "Recall lies on the diagonal.",
            )
        )
    else:
        blocks.append(
            "<p>The E6 figure needs Precision, Recall, Density and Coverage in both "
            "aggregations.</p>"
        )
    return section("figures", "Figures (E1 and E6 for these models)", "".join(blocks))


# ---------------------------------------------------------------------------
# Helpers


def _check(scores: pd.DataFrame) -> pd.DataFrame:
    check(scores)
    scores = scores[list(COLUMNS)].copy()
    scores["model"] = scores["model"].astype(str)
    scores["client"] = scores["client"].astype(str)
    duplicated = scores.duplicated(["model", "metric", "aggregation", "client"])
    if duplicated.any():
        row = scores[duplicated].iloc[0]
        raise ValueError(
            f"scores: more than one value for model {row.model!r}, metric "
            f"{row.metric!r}, aggregation {row.aggregation!r}, client "
            f"{row.client!r}"
        )
    return scores[~scores["metric"].isin(spread_keys())]  # spreads: no scores to rank by
