"""A score table summarised for a reader: its ``all`` and ``avg`` values per model and
Kendall's tau between the two rankings per metric (``summary_taus``),
as text (what ``distrank score`` prints) or Markdown (its ``--format markdown``)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from distrank._io import atomic_path
from distrank.metrics._registry import display
from distrank.metrics._table import summary_taus
from distrank.tables import to_markdown

__all__ = ["markdown_summary", "summary", "write_markdown"]


def summary(scores: pd.DataFrame) -> str:
    """The all/avg values as a model x metric text table, and Kendall tau per metric."""
    table, taus = summary_taus(scores)
    lines = [
        table.to_string(float_format=lambda v: f"{v:.6g}"),
        "",
        "Kendall tau between the 'all' and 'avg' rankings of the models:",
    ]
    for metric, (n, tau) in taus.items():
        text = (
            "n/a (fewer than 2 models)"
            if n < 2
            else "n/a (ties)"
            if np.isnan(tau)
            else f"{tau:+.3f}"
        )
        lines.append(f"  {metric:<10} {text}")
    return "\n".join(lines)


def markdown_summary(scores: pd.DataFrame) -> str:
    """All and avg per model, and Kendall tau per metric, as Markdown tables."""
    table, taus = summary_taus(scores)
    table.columns = [f"{display(m)}_{a}" for m, a in table.columns]
    parts = [to_markdown(table.reset_index(), caption="all and avg per model", float_format=".6g")]
    if taus:
        rows = [
            {"metric": display(m), "n_models": n, "kendall_tau": tau}
            for m, (n, tau) in taus.items()
        ]
        parts.append(
            to_markdown(
                pd.DataFrame(rows),
                float_format="+.3f",
                caption="Kendall tau between the all and avg rankings",
            )
        )
    return "\n".join(parts)


def write_markdown(scores: pd.DataFrame, out: str | os.PathLike) -> None:
    """:func:`markdown_summary` of ``scores``, written atomically to ``out``."""
    with atomic_path(out) as tmp:
        tmp.write_text(markdown_summary(scores), encoding="utf-8")
