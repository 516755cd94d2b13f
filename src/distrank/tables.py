"""Result tables in three formats: CSV (for machines), Markdown and LaTeX (for people).

``write_table(df, stem)`` writes ``stem.csv``, ``stem.md`` and ``stem.tex``:

- CSV keeps every float at full precision (shortest round-trip repr), so tests and
  downstream scripts read back exactly the numbers that were computed.
- Markdown (GitHub/pandoc pipe table) and LaTeX (booktabs: ``\\toprule``,
  ``\\midrule``, ``\\bottomrule``; needs ``\\usepackage{booktabs}``) format floats
  with ``float_format``; LaTeX special characters in headers and cells are escaped.

Output is a pure function of the DataFrame and arguments: same input, same bytes.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from distrank._io import atomic_write_bytes, output_path

__all__ = ["write_table", "format_cells", "to_markdown", "to_latex", "latex_escape"]

FloatFormat = str | Callable[[float], str]

_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def latex_escape(text: str) -> str:
    """Escape the ten LaTeX special characters so ``text`` prints literally."""
    return "".join(_LATEX_SPECIALS.get(ch, ch) for ch in text)


def _format_value(value: object, float_format: FloatFormat) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            return ""
        return float_format(value) if callable(float_format) else format(value, float_format)
    return str(value)


def format_cells(df: pd.DataFrame, float_format: FloatFormat = ".4g") -> pd.DataFrame:
    """All cells as strings: floats through ``float_format`` (a format spec such as
    ``".4g"`` or a callable), integers exactly, missing values empty."""
    return pd.DataFrame(
        {col: [_format_value(v, float_format) for v in df[col].tolist()] for col in df.columns},
        columns=list(df.columns),
    )


def _is_numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


def to_markdown(
    df: pd.DataFrame, *, caption: str | None = None, float_format: FloatFormat = ".4g"
) -> str:
    """Pipe table (numbers right-aligned), preceded by ``Table: caption`` if given."""
    cells = format_cells(df, float_format)
    colalign = tuple("right" if _is_numeric(df[c]) else "left" for c in df.columns)
    table = cells.to_markdown(index=False, disable_numparse=True, colalign=colalign)
    head = f"Table: {caption}\n\n" if caption else ""
    return f"{head}{table}\n"


def to_latex(
    df: pd.DataFrame,
    *,
    caption: str | None = None,
    label: str | None = None,
    float_format: FloatFormat = ".4g",
) -> str:
    """booktabs ``tabular``; wrapped in a ``table`` float when a caption is given."""
    cells = format_cells(df, float_format)
    spec = "".join("r" if _is_numeric(df[c]) else "l" for c in df.columns)
    lines = [
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(latex_escape(str(c)) for c in df.columns) + r" \\",
        r"\midrule",
    ]
    lines += [
        " & ".join(latex_escape(v) for v in row) + r" \\" for row in cells.itertuples(index=False)
    ]
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        float_lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_escape(caption)}}}"]
        if label:
            float_lines.append(rf"\label{{{label}}}")
        lines = float_lines + lines + [r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_table(
    df: pd.DataFrame,
    stem: str | os.PathLike[str],
    *,
    caption: str | None = None,
    float_format: FloatFormat = ".4g",
) -> dict[str, Path]:
    """Write ``stem.csv``, ``stem.md`` and ``stem.tex`` atomically.

    Parameters
    ----------
    df : the table; its index is not written (put identifiers in columns).
    stem : output path without suffix, e.g. ``results/default/E1_kd_gap``.
    caption : optional caption for the Markdown and LaTeX versions. The LaTeX label
        is ``tab:<file name of stem>``.
    float_format : format spec (``".4g"``) or callable for floats in ``.md`` and
        ``.tex``; the CSV always keeps full precision.

    Returns the written paths keyed by ``"csv"``, ``"md"``, ``"tex"``.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df must be a pandas DataFrame, got {type(df).__name__}")
    label = f"tab:{Path(os.fspath(stem)).name}"
    texts = {
        "csv": df.to_csv(index=False, lineterminator="\n"),
        "md": to_markdown(df, caption=caption, float_format=float_format),
        "tex": to_latex(df, caption=caption, label=label, float_format=float_format),
    }
    return {
        kind: atomic_write_bytes(output_path(stem, f".{kind}"), text.encode("utf-8"))
        for kind, text in texts.items()
    }
