"""The agreement study's figure: disagreement against the resource, one panel per
data set, with the bound(s) from the same runs and the failure points marked."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd
from matplotlib import ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from distrank.figures import new_figure, paper_style

__all__ = [
    "DATA_NAMES",
    "D_LABEL",
    "FAILURE_LABEL",
    "INTEGER_TICKS",
    "lemma_labels",
    "agreement_figure",
]

#: Panel titles of the data sets.
DATA_NAMES = {
    "friedman1": "Friedman #1 (noise 1)",
    "diabetes": "diabetes (uniform over rows)",
    "digits_onehot": "digits, one-hot (squared loss)",
    "digits_binary": "digits, digit ≥ 5 (logistic loss)",
}

FAILURE_LABEL = "plug-in bound < D or < 0"
INTEGER_TICKS = ticker.FuncFormatter(lambda v, _: f"{v:g}")
D_LABEL = "mean $D$, 95 % interval over pairs"
BOUND_STYLES = (
    {"color": "C0", "ls": "--"},
    {"color": "C2", "ls": ":"},
    {"color": "C1", "ls": "-."},
)


def lemma_labels(p: str, *, constant: str = "4", half: str = "2") -> dict[str, str]:
    """Legend labels of the plug-in lemma bound (``bound``) and its anchor form
    (``bound_anchor``) at resource ``p``; ``constant`` is 8/mu, ``half`` 4/mu."""
    return {
        "bound": rf"plug-in ${constant}(\hat R_{{{p}}} - \hat R_{{2{p}}} + \hat\varepsilon)$",
        "bound_anchor": rf"anchor form ${half}(R(f_1) + R(f_2) - 2\hat R_{{2{p}}})$",
    }


def agreement_figure(
    summary: pd.DataFrame,
    *,
    resource_label: str,
    bounds: Mapping[str, str],
    panel: str = "data",
    logx: bool = True,
    logy: bool = False,
    ylabel: str = "disagreement $D$",
    titles: Mapping[str, str] | None = None,
    decorate: Callable[[Axes, pd.DataFrame], None] | None = None,
) -> Figure:
    """Mean ``D`` with its interval (``D_lo``, ``D_hi``) against ``resource``, each
    bound column ``<b>_mean`` (band ``<b>_lo``..``<b>_hi``) labelled by ``bounds``
    (skipped in a panel where it is absent or NaN),
    and a red cross on every point flagged ``failure``. One panel per value of
    ``panel``; ``decorate(ax, rows)`` adds family-specific lines. The legend sits
    below the panels, off the data."""
    missing = [
        c
        for c in ("resource", "D_mean", "D_lo", "D_hi", "failure", panel)
        if c not in summary.columns
    ]
    if missing:
        raise ValueError(f"summary lacks columns {missing}")
    titles = {**DATA_NAMES, **(titles or {})}
    present = list(dict.fromkeys(summary[panel]))
    names = [n for n in titles if n in present] + [n for n in present if n not in titles]
    with paper_style():
        fig, axes = new_figure(
            1,
            len(names),
            width="single" if len(names) == 1 else "double",
            height=2.6 if len(names) > 1 else 2.8,
        )
        for ax, name in zip(axes[0], names):
            rows = summary[summary[panel] == name].sort_values("resource")
            _draw_panel(ax, rows, bounds, logy=logy)
            if decorate is not None:
                decorate(ax, rows)
            _set_axes(ax, logx=logx, logy=logy, xlabel=resource_label)
            ax.set_title(titles.get(name, name))
        axes[0][0].set_ylabel(ylabel)
        _shared_legend(fig, axes[0], one_panel=len(names) == 1)
    return fig


def _draw_panel(ax: Axes, rows: pd.DataFrame, bounds: Mapping[str, str], *, logy: bool) -> None:
    """Mean D with its interval, each bound present with its band, the failures."""
    x = rows["resource"].to_numpy(dtype=float)
    d = rows["D_mean"].to_numpy()
    err = np.vstack([d - rows["D_lo"].to_numpy(), rows["D_hi"].to_numpy() - d])
    ax.errorbar(
        x,
        d,
        yerr=err,
        color="k",
        marker="o",
        ms=3,
        capsize=2,
        lw=1.0,
        label=D_LABEL,
        zorder=3,
    )
    for (b, label), style in zip(bounds.items(), BOUND_STYLES):
        if f"{b}_mean" not in rows or rows[f"{b}_mean"].isna().all():
            continue
        mean = rows[f"{b}_mean"].to_numpy()
        ax.plot(x, mean, marker=".", label=label, **style, zorder=2)
        ax.fill_between(
            x,
            rows[f"{b}_lo"].to_numpy(),
            rows[f"{b}_hi"].to_numpy(),
            color=style["color"],
            alpha=0.15,
            lw=0,
        )
        if not logy and np.nanmin(mean) < 0:
            ax.axhline(0.0, color="0.6", lw=0.6)
    fail = rows["failure"].to_numpy(dtype=bool)
    if fail.any():
        ax.plot(
            x[fail],
            d[fail],
            ls="none",
            marker="x",
            ms=8,
            mew=1.5,
            color="C3",
            label=FAILURE_LABEL,
            zorder=4,
        )


def _set_axes(ax: Axes, *, logx: bool, logy: bool, xlabel: str) -> None:
    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(INTEGER_TICKS)
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)


def _shared_legend(fig: Figure, axes, *, one_panel: bool) -> None:
    """One legend below the panels: every label once, D's first."""
    handles, labels = {}, [D_LABEL]
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in handles:
                handles[lab] = h
                labels += [] if lab in labels else [lab]
    fig.legend(
        [handles[lab] for lab in labels],
        labels,
        loc="outside lower center",
        ncols=2 if one_panel or len(labels) > 3 else len(labels),
    )
