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
  between the two rankings, per metric (:mod:`distrank.metrics.table`);
- the E1 and E6 figures of the pipeline, drawn for these models;
- for a table with client rows only (a federation that never pooled data), what
  the clients' scores do and do not tell about the centralized ranking.

Numbers are shown to four significant digits (the table keeps every digit), and a
difference within float rounding of the scores it is taken from as such.

Options the table was computed with (client weights, KD estimator, client sizes,
extractor) come from the metadata ``distrank score`` writes beside it; without
them the page says which conclusions depend on them.
"""

from __future__ import annotations

import base64
import html
import io
import os
import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from distrank._io import atomic_write_bytes
from distrank.experiments.e1_kd_consistency import e1_table
from distrank.experiments.e6_prdc import e6_table
from distrank.figures import e1_figure, e6_figure
from distrank.metrics.ranking import rank_models
from distrank.metrics.registry import HIGHER_IS_BETTER, PRDC, display
from distrank.metrics.table import COLUMNS, check, flipped_pairs
from distrank.metrics.table import per_metric as _per_metric
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

    Args:
        meta: what ``distrank score`` records beside its table (``options`` with
            ``weights`` and ``kd_estimator``; ``reference`` with each client's ``n``);
            None or {} when unknown.
        extractor: the feature network, named on the figures' axes.
        title, source: the page title (default: from ``source``), and the table's file.
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
            _values_section(scores, name),
            _consistency_section(scores, meta, name),
            _flips_section(scores, name),
            _figures_section(scores, extractor),
        ]
    else:
        body.append(_client_only_section(scores, meta, name))
    if (scores["aggregation"] == "client").any():
        body.append(_clients_section(scores, name))
    return _PAGE.format(title=_e(title), style=_STYLE, body="\n".join(body))


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
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
    return f'<header><h1>{_e(title)}</h1><dl class="facts">{items}</dl></header>'


def _values_section(scores, name) -> str:
    per_metric = _per_metric(scores)
    arrows = {m: "&uarr;" if HIGHER_IS_BETTER.get(m, False) else "&darr;" for m in per_metric}
    head = "".join(f"<th class=num>{_e(name(m))} {arrows[m]}</th>" for m in per_metric)
    ranks = {
        (m, agg): dict(
            zip(w.index, rank_models(w[agg], higher_is_better=HIGHER_IS_BETTER.get(m, False)))
        )
        for m, w in per_metric.items()
        for agg in ("all", "avg")
    }
    rows = []
    for model in sorted(set().union(*(w.index for w in per_metric.values()))):
        for agg in ("all", "avg"):  # stacked, so the table is as wide as the metrics
            cells = [f"<td rowspan=2>{_e(model)}</td>"] if agg == "all" else []
            cells.append(f"<td class=agg>{agg}</td>")
            for metric, wide in per_metric.items():
                if model not in wide.index:  # this metric was not computed for this model
                    cells.append("<td class=num>n/a</td>")
                    continue
                cells.append(
                    f'<td class=num data-model="{_e(model)}" data-metric="{_e(metric)}" '
                    f'data-aggregation="{agg}">{_num(wide.at[model, agg])} <span class=rank>'
                    f"({ranks[(metric, agg)][model]})</span></td>"
                )
            rows.append(f'<tr class="{agg}">{"".join(cells)}</tr>')
    body = (
        f'<table class="values"><thead><tr><th>model</th><th></th>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    return _section(
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
    rows = []
    for r in consistency(scores, meta).itertuples():
        verdict_class = "ok" if r.verdict in ("safe", "exact") else "warn"
        measured = "<br>".join(_measured(r, name))
        rows.append(
            f'<tr data-metric="{_e(r.metric)}"><td>{_e(name(r.metric))}</td>'
            f'<td class="{verdict_class} verdict">{_e(r.verdict)}</td>'
            f"<td>{_e(_named(r.why, name))}</td><td class=measured>{measured}</td>"
            f'<td class="num tau">{_tau(r.kendall_tau)}</td></tr>'
        )
    body = (
        '<table class="consistency"><thead><tr><th>metric</th><th>safe to average?</th>'
        "<th>why</th><th>measured on these models</th><th>Kendall tau (avg vs all)</th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
    return _section(
        "consistency",
        "Which metrics are safe to average across clients",
        body,
        "<p>A metric is safe to average when ranking by avg is ranking by all, for "
        "every set of models, by a theorem rather than by luck. Kendall tau is 1 "
        "when both rankings agree on every pair. A difference within float rounding of "
        "the scores it is taken from is shown as such.</p>",
    )


def _measured(r, name) -> list[str]:
    """The lines of a :func:`consistency` row's "measured on these models" cell."""
    gap = partial(_difference, rounding=r.rounding)
    flips = f"{r.rank_flips} flipped pair{'s' * (r.rank_flips != 1)}"
    if r.metric == "kd":
        kd = _e(name("kd"))
        constant = "constant" if r.gap_constant else "<b>varies across models</b>"
        return [
            f"gap {kd}_avg - {kd}_all: <span class=gap>{gap(r.gap_mean)}</span> (mean)",
            f"max - min: {gap(r.gap_range)}, {constant}",
            flips,
        ]
    if r.metric == "recall":
        return [f"max |avg - all|: {gap(r.max_absdiff)}", flips]
    return [f"gap avg - all: {gap(r.gap_mean)} (mean)", f"max - min: {gap(r.gap_range)}", flips]


def _flips_section(scores, name) -> str:
    items = []
    for metric in _per_metric(scores):
        pairs, shown = flipped_pairs(scores, metric), name(metric)
        if pairs.empty:
            items.append(
                f'<li data-metric="{_e(metric)}" data-flips="0"><b>{_e(shown)}</b>: '
                "no pair flips; all and avg rank these models alike.</li>"
            )
            continue
        flips = "".join(
            f"<li><b>{_e(p.model_a)}</b> is better than <b>{_e(p.model_b)}</b> by {_e(shown)}_all "
            f"({_num(p.a_all)} against {_num(p.b_all)}), worse by {_e(shown)}_avg "
            f"({_num(p.a_avg)} against {_num(p.b_avg)})</li>"
            for p in pairs.itertuples()
        )
        items.append(
            f'<li data-metric="{_e(metric)}" data-flips="{len(pairs)}"><b>{_e(shown)}'
            f"</b>: {len(pairs)} flipped pair{'s' * (len(pairs) != 1)}<ul>{flips}</ul></li>"
        )
    return _section(
        "flips",
        "Where avg and all disagree: model pairs that flip",
        f"<ul class=flips>{''.join(items)}</ul>",
    )


def _figures_section(scores, extractor) -> str:
    name = partial(display, extractor=extractor)
    blocks = []
    metrics = set(_per_metric(scores))
    if {"kd", "fd"} <= metrics:
        table, _ = e1_table(scores)
        blocks.append(
            _figure(
                e1_figure(table, extractor),
                "E1",
                _named(
                    "KD_avg against KD_all (left): one line of slope 1, the gap of "
                    "Theorem 1. FD (right): pairs whose order flips are joined in red.",
                    name,
                ),
            )
        )
    else:
        blocks.append(_named("<p>The E1 figure needs KD and FD in both aggregations.</p>", name))
    if set(PRDC) <= metrics:
        table, _ = e6_table(scores)
        blocks.append(
            _figure(
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
    return _section("figures", "Figures (E1 and E6 for these models)", "".join(blocks))


def _client_only_section(scores, meta, name) -> str:
    clients = scores[scores["aggregation"] == "client"]
    if clients.empty:
        raise ValueError("scores: no 'all', 'avg' or 'client' rows to report on")
    sizes = {c: v.get("n") for c, v in (meta.get("reference") or {}).items()}
    weights = (meta.get("options") or {}).get("weights")
    avg = scores[scores["aggregation"] == "avg"]
    known_sizes = bool(sizes) and all(sizes.get(c) for c in set(clients["client"]))
    if avg.empty:
        avg = _client_average(clients, sizes if known_sizes else None)
        how = (
            "avg computed here with weights n_i/n from the recorded client sizes"
            if known_sizes
            else "avg computed here as the plain mean of the clients "
            "(client sizes not recorded: weights 1/k)"
        )
    else:
        how = "avg as given in the table"
    lines = []
    for metric, rows in avg.groupby("metric", sort=False):
        order = _ranking(rows.set_index("model")["value"], metric)
        ranking = " &gt; ".join(_e(m) for m in order)
        if metric == "kd":
            kd = _e(name("kd"))
            text = (
                f"<b>{kd}</b>: the centralized ranking is known without pooling the data: by "
                "Theorem 1 it is the avg ranking, " + ranking + ", provided the clients "
                "used weights n_i/n, one kernel (a bandwidth fixed for all), the same "
                f"samples and a full-sample estimator. {kd}_all itself is not known: its "
                "offset needs kernel sums across clients."
            )
        elif metric == "recall":
            text = (
                "<b>Recall</b>: Recall_all = sum_i (n_i/n) Recall_i exactly, so the "
                "pooled values are known"
                + (
                    " and are the avg values: " + ranking
                    if known_sizes or weights == "size"
                    else " once the client sizes n_i are known"
                )
                + "."
            )
        else:
            text = (
                f"<b>{_e(name(metric))}</b>: only the avg ranking ({ranking}) is "
                "known. The centralized ranking may differ"
                + (
                    f": {_e(name('fd'))}_all follows from the clients' (n_i, mean, covariance), not "
                    "from their FD scores; share those statistics to compute it."
                    if metric == "fd"
                    else ", and the client scores cannot tell how."
                )
                + " Even clients that agree do not fix the pooled order (Proposition 1)."
            )
        lines.append(f'<li data-metric="{_e(metric)}">{text}</li>')
    body = (
        f"<p>This table has no pooled ('all') rows: the reference data were never "
        f"pooled. {_e(how)}.</p><ul class=conclusions>{''.join(lines)}</ul>"
    )
    return _section("client-only", "What can and cannot be concluded without pooled data", body)


def _clients_section(scores, name) -> str:
    rows = scores[scores["aggregation"] == "client"]
    blocks = []
    for metric, part in rows.groupby("metric", sort=False):
        wide = part.pivot_table(
            index="model", columns="client", values="value", aggfunc="first"
        ).sort_index()
        agree = _clients_agree(wide, metric)
        blocks.append(
            f"<h3>{_e(name(metric))}</h3><p>{_e(agree)}</p>"
            + _table(wide.reset_index(), metric=metric)
        )
    return _section(
        "clients",
        "Each client's scores",
        "".join(blocks),
        "<details open><summary>what each client measured</summary>",
        "</details>",
    )


# ---------------------------------------------------------------------------
# Helpers


def _client_average(clients: pd.DataFrame, sizes: Mapping | None) -> pd.DataFrame:
    def mean(rows):
        w = np.array([sizes[c] for c in rows["client"]], float) if sizes else np.ones(len(rows))
        return float(np.dot(w / w.sum(), rows["value"].to_numpy(float)))

    grouped = clients.groupby(["model", "metric"], sort=False)
    return pd.DataFrame(
        [
            {"model": m, "metric": k, "aggregation": "avg", "client": "", "value": mean(rows)}
            for (m, k), rows in grouped
        ]
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
    return scores[scores["metric"] != "kd_std"]  # a spread, not a score to rank by


def _figure(fig, key: str, caption: str) -> str:
    from matplotlib import pyplot as plt

    from distrank.figures import paper_style

    buffer = io.BytesIO()
    with paper_style():
        fig.savefig(buffer, format="png", dpi=150, metadata={"Software": None})
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (
        f'<figure data-figure="{key}"><img alt="{key} figure for these models" '
        f'src="data:image/png;base64,{data}"><figcaption><b>{key}.</b> {_e(caption)}'
        "</figcaption></figure>"
    )


def _table(df: pd.DataFrame, *, metric: str | None = None) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for column, value in zip(df.columns, row):
            numeric = isinstance(value, (int, float, np.integer, np.floating))
            text = _num(value) if numeric else _e(value)
            cells.append(
                f'<td class="num" data-column="{_e(column)}">{text}</td>'
                if numeric
                else f"<td>{text}</td>"
            )
        body.append(f"<tr>{''.join(cells)}</tr>")
    attr = f' data-metric="{_e(metric)}"' if metric else ""
    return (  # in its own scroll box: a table of many clients scrolls, not the page
        f"<div class=wide><table{attr}><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _section(key: str, heading: str, body: str, intro: str = "", outro: str = "") -> str:
    return f'<section id="{key}"><h2>{_e(heading)}</h2>{intro}{body}{outro}</section>'


def _named(text: str, name) -> str:
    """``text`` with the words KD and FD (also in KD_all, KD(...)) as ``name`` shows them."""
    return re.sub(r"\b(KD|FD)(?=_|\b)", lambda m: name(m[1].lower()), text)


def _num(value) -> str:
    """An integer as it is; a float to four significant digits (zeros kept)."""
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    value = float(value)
    return "n/a" if np.isnan(value) else f"{value + 0.0:#.4g}"  # + 0.0: no "-0.000"


def _difference(value: float, rounding: float) -> str:
    """:func:`_num` of a difference, or ``< 1e-12 (float rounding)`` where it is nonzero
    but within ``rounding`` (:func:`distrank.report.verdicts.rounding_level`), bounded by
    the power of ten above."""
    if value and abs(value) <= rounding:
        return f"&lt; {10.0 ** np.ceil(np.log10(rounding)):.0e} (float rounding)"
    return _num(value)


def _tau(value: float) -> str:
    return "n/a" if np.isnan(value) else f"{value:+#.4g}"


def _e(value) -> str:
    return html.escape(str(value), quote=True)


_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; }
.facts { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; }
.facts dt { font-weight: 600; }
table { border-collapse: collapse; margin: .5em 0 1.2em; }
th, td { border-bottom: 1px solid #ddd; padding: .25em .7em; text-align: left;
         vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th.num { text-align: right; }
.wide { overflow-x: auto; }
.ok { color: #126b12; font-weight: 600; } .warn { color: #a44a00; font-weight: 600; }
.rank { color: #666; font-size: .8em; }
.values td.agg { color: #666; } .values tr.all td.agg, .values tr.all td.num { border-bottom: 0; }
td.measured { white-space: nowrap; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #444; font-size: .9em; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
{body}
</body>
</html>
"""
