"""The markup of the consistency page (:mod:`distrank.report.html`): numbers as the page
shows them, escaped text, tables, sections, embedded figures and the page around them.

Nothing here knows a metric: the sections (:mod:`distrank.report.html` for the pooled
ones, :mod:`distrank.report.client_sections` for the clients') put these together.
"""

from __future__ import annotations

import base64
import html
import io
import re

import numpy as np
import pandas as pd

__all__ = ["difference", "esc", "figure", "named", "num", "page", "section", "table", "tau"]


def page(title: str, body: str) -> str:
    """The whole page: ``body`` (HTML) under ``title`` (text), with its style sheet."""
    return _PAGE.format(title=esc(title), style=_STYLE, body=body)


def section(key: str, heading: str, body: str, intro: str = "", outro: str = "") -> str:
    """A ``<section id=key>`` titled ``heading`` (text); ``intro``, ``body`` and ``outro``
    are HTML."""
    return f'<section id="{key}"><h2>{esc(heading)}</h2>{intro}{body}{outro}</section>'


def table(df: pd.DataFrame, *, metric: str | None = None) -> str:
    """``df`` as an HTML table in its own scroll box, numbers by :func:`num`."""
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for column, value in zip(df.columns, row):
            numeric = isinstance(value, (int, float, np.integer, np.floating))
            text = num(value) if numeric else esc(value)
            cells.append(
                f'<td class="num" data-column="{esc(column)}">{text}</td>'
                if numeric
                else f"<td>{text}</td>"
            )
        body.append(f"<tr>{''.join(cells)}</tr>")
    attr = f' data-metric="{esc(metric)}"' if metric else ""
    return (  # in its own scroll box: a table of many clients scrolls, not the page
        f"<div class=wide><table{attr}><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def figure(fig, key: str, caption: str) -> str:
    """A matplotlib figure as an embedded PNG (closed once drawn), with its caption."""
    from matplotlib import pyplot as plt

    from distrank.figures import paper_style

    buffer = io.BytesIO()
    with paper_style():
        fig.savefig(buffer, format="png", dpi=150, metadata={"Software": None})
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return (
        f'<figure data-figure="{key}"><img alt="{key} figure for these models" '
        f'src="data:image/png;base64,{data}"><figcaption><b>{key}.</b> {esc(caption)}'
        "</figcaption></figure>"
    )


def named(text: str, name) -> str:
    """``text`` with the words KD and FD (also in KD_all, KD(...)) as ``name`` shows them."""
    return re.sub(r"\b(KD|FD)(?=_|\b)", lambda m: name(m[1].lower()), text)


def num(value) -> str:
    """An integer as it is; a float to four significant digits (zeros kept)."""
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    value = float(value)
    return "n/a" if np.isnan(value) else f"{value + 0.0:#.4g}"  # + 0.0: no "-0.000"


def difference(value: float, rounding: float) -> str:
    """:func:`num` of a difference, or ``< 1e-12 (float rounding)`` where it is nonzero
    but within ``rounding`` (:func:`distrank.report.verdicts.rounding_level`), bounded by
    the power of ten above."""
    if value and abs(value) <= rounding:
        return f"&lt; {10.0 ** np.ceil(np.log10(rounding)):.0e} (float rounding)"
    return num(value)


def tau(value: float) -> str:
    """Kendall's tau with its sign, to four significant digits (``n/a`` for NaN)."""
    return "n/a" if np.isnan(value) else f"{value:+#.4g}"


def esc(value) -> str:
    """``str(value)`` escaped for HTML text and attribute values."""
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
