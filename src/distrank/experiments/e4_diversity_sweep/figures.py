"""E4's figures: FD against the knob (:func:`e4_figure`), FD's terms
(:func:`e4_terms_figure`) and the image families' samples (:func:`e4_samples_figure`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from distrank.figures import DOUBLE_COLUMN_IN, metric_name, new_figure, paper_style
from distrank.metrics._registry import display
from distrank.metrics.fd._settings import EXTRAPOLATED, FEATURES, SPLIT

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["e4_figure", "e4_terms_figure", "e4_samples_figure"]

_AGG_STYLE = {
    "all": {"color": "tab:blue", "ls": "-", "marker": "o"},
    "avg": {"color": "tab:orange", "ls": "--", "marker": "s"},
}


def _setting_label(setting: str, extractor: str) -> str:
    """How a setting names FD on an axis."""
    fd = metric_name("fd", extractor)
    if setting.startswith("pca"):
        return f"{fd}, PCA to {setting[3:]} dims"
    return {FEATURES: f"{fd} as scored", EXTRAPOLATED: rf"{fd}$_\infty$ (line in 1/m)"}.get(
        setting, f"{fd}, {setting}"
    )


def _grid(fd: pd.DataFrame, height_per_row: float):
    """A figure with one row per setting and one column per family of ``fd``."""
    settings = list(dict.fromkeys(fd["setting"]))
    families = list(dict.fromkeys(fd["family"]))
    fig, axes = new_figure(
        len(settings),
        len(families),
        width="double",
        height=height_per_row * len(settings) + 0.7,
        sharex="col",
    )
    return fig, axes, settings, families


def _knob_axis(ax, group: pd.DataFrame, last_row: bool) -> None:
    if last_row:
        arrow = "less" if group["diversity"].iloc[0] == "decreasing" else "more"
        ax.set_xlabel(f"{group['knob'].iloc[0]}\n({arrow} diverse →)")


def e4_figure(fd: pd.DataFrame, theory: pd.DataFrame, extractor: str) -> Figure:
    """FD_all (solid) and FD_avg (dashed) against the knob, one row per FD setting and
    one column per family (``fd``:
    :func:`~distrank.experiments.e4_diversity_sweep.sweep.fd_curves`): the seeds' mean
    with the band of the lowest to highest seed, the best knob of each mean curve marked
    (a filled marker), and for a fitted family its FD without sampling (thin grey,
    ``theory``: :func:`~distrank.experiments.e4_diversity_sweep.sweep.theory_table`) with
    its best knobs (open markers). Both aggregations share one y axis, so the gap
    FD_avg - FD_all shows."""
    from matplotlib.lines import Line2D

    with paper_style():
        fig, axes, settings, families = _grid(fd, 1.45)
        for r, setting in enumerate(settings):
            for c, family in enumerate(families):
                ax = axes[r, c]
                mine = fd[(fd["setting"] == setting) & (fd["family"] == family)]
                exact = theory[(theory["setting"] == setting) & (theory["family"] == family)]
                for agg, style in _AGG_STYLE.items():
                    _curve_with_band(ax, mine[mine["aggregation"] == agg], exact, agg, style)
                _knob_axis(ax, mine, r == len(settings) - 1)
                if r == 0:
                    ax.set_title(family, loc="left")
                if c == 0:
                    ax.set_ylabel(_setting_label(setting, extractor))
        name, band = display("fd", extractor), ", seeds' band" if fd["seed"].nunique() > 1 else ""
        handles = [
            Line2D([], [], color=s["color"], ls=s["ls"], label=rf"{name}$_\mathrm{{{a}}}${band}")
            for a, s in _AGG_STYLE.items()
        ] + [Line2D([], [], color="0.3", ls="", marker="o", label="best knob (seeds' mean)")]
        if len(theory):  # a fitted family
            handles.append(
                Line2D(
                    [],
                    [],
                    color="0.55",
                    lw=0.8,
                    marker="o",
                    mfc="white",
                    label="fitted: no sampling",
                )
            )
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    return fig


def _curve_with_band(ax, rows: pd.DataFrame, exact: pd.DataFrame, agg: str, style) -> None:
    """One aggregation's seed mean, seeds' band and best knob (and its theory)."""
    by_value = rows.groupby("value")["fd"]
    mean, low, high = by_value.mean(), by_value.min(), by_value.max()
    ax.fill_between(mean.index, low, high, color=style["color"], alpha=0.2, lw=0)
    ax.plot(mean.index, mean, color=style["color"], ls=style["ls"], lw=1.0)
    best = int(np.argmin(mean.to_numpy()))
    ax.plot(mean.index[best], mean.iloc[best], marker=style["marker"], color=style["color"], ms=4)
    exact = exact[exact["aggregation"] == agg].sort_values("value")
    if len(exact):
        ax.plot(exact["value"], exact["fd"], color="0.55", lw=0.8, ls=style["ls"], zorder=1)
        i = int(np.argmin(exact["fd"].to_numpy()))
        ax.plot(
            exact["value"].iloc[i],
            exact["fd"].iloc[i],
            marker=style["marker"],
            mfc="white",
            color=style["color"],
            ms=4,
        )


def e4_terms_figure(fd: pd.DataFrame, extractor: str) -> Figure:
    """What moves the best knob: FD's terms against the knob, each as its change from
    the first knob value (seeds' mean), one row per setting and one column per family:
    the mean term ``|mu_X - mu_Y|^2`` (black; FD_avg's differs by a constant), the model's
    tr C_Y (shared) split into its parts within (green) and between (purple) its
    classes, and -2 tr(C_X^1/2 C_Y C_X^1/2)^1/2 against the pool (blue) and averaged
    over the clients (orange, dashed). FD_all's change is black + green + purple +
    blue, FD_avg's black + green + purple + orange: only the root term tells them
    apart, and a knob that scaled C_Y would move green and purple together."""
    from matplotlib.lines import Line2D

    fd = fd.assign(within=fd["trace_model"] - fd[SPLIT], root=-2 * fd["root"])
    lines = {
        ("all", "mean"): {"color": "black", "ls": "-", "label": r"$|\mu_X-\mu_Y|^2$"},
        ("all", "within"): {"color": "tab:green", "ls": "-", "label": r"tr $C_Y$ within classes"},
        ("all", SPLIT): {"color": "tab:purple", "ls": "-", "label": r"tr $C_Y$ between classes"},
        ("all", "root"): {"color": "tab:blue", "ls": "-", "label": r"$-2$ root, all"},
        ("avg", "root"): {"color": "tab:orange", "ls": "--", "label": r"$-2$ root, avg"},
    }
    with paper_style():
        fig, axes, settings, families = _grid(fd, 1.3)
        for r, setting in enumerate(settings):
            for c, family in enumerate(families):
                ax = axes[r, c]
                mine = fd[(fd["setting"] == setting) & (fd["family"] == family)]
                for (agg, term), style in lines.items():
                    curve = mine[mine["aggregation"] == agg].groupby("value")[term].mean()
                    change = curve - curve.iloc[0]
                    ax.plot(change.index, change, color=style["color"], ls=style["ls"], lw=1.0)
                ax.axhline(0, color="0.8", lw=0.5, zorder=0)
                _knob_axis(ax, mine, r == len(settings) - 1)
                if r == 0:
                    ax.set_title(family, loc="left")
                if c == 0:
                    ax.set_ylabel(f"change of each term\n{_setting_label(setting, extractor)}")
        handles = [
            Line2D([], [], color=s["color"], ls=s["ls"], label=s["label"]) for s in lines.values()
        ]
        fig.legend(handles=handles, loc="outside lower center", ncols=5)
    return fig


def e4_samples_figure(
    samples: Mapping[str, np.ndarray], models: Mapping[str, Mapping], per_row: int = 12
) -> Figure:
    """Samples of each image family (one panel per family), one row per knob value:
    the first ``per_row`` images of each sweep model. ``samples`` maps model names to
    uint8 images (N, H, W) or (N, H, W, C)."""
    families = list(dict.fromkeys(models[name]["family"] for name in samples))
    if not families:  # a sweep of feature-space families only
        with paper_style():
            fig, axes = new_figure(1, 1, width="single", height=0.6)
            axes[0, 0].set_axis_off()
            axes[0, 0].text(0.5, 0.5, "no image family in this sweep", ha="center")
        return fig
    rows_most = max(sum(models[n]["family"] == f for n in samples) for f in families)
    panel = DOUBLE_COLUMN_IN / len(families)
    with paper_style():
        fig, axes = new_figure(
            1, len(families), width="double", height=panel * rows_most / per_row + 0.55
        )
        for ax, family in zip(axes.flat, families):
            names = [n for n in samples if models[n]["family"] == family]
            rows = [np.concatenate(list(_as_rgb(samples[n][:per_row])), axis=1) for n in names]
            ax.imshow(
                np.concatenate(rows, axis=0), cmap="gray", vmin=0, vmax=255, interpolation="nearest"
            )
            side = samples[names[0]].shape[1]
            ax.set_yticks(
                [side * (i + 0.5) for i in range(len(names))],
                [f"{models[n]['value']:g}" for n in names],
            )
            ax.set_xticks([])
            ax.set_ylabel(models[names[0]]["knob"])
            ax.set_title(family, loc="left")
            ax.set_anchor("N")  # panels of fewer rows hang from the same top line
            for spine in ax.spines.values():
                spine.set_visible(False)
    return fig


def _as_rgb(images: np.ndarray) -> np.ndarray:
    """(N, H, W) or (N, H, W, 1) grey, or (N, H, W, 3) colour, as imshow takes them."""
    return images[..., 0] if images.ndim == 4 and images.shape[-1] == 1 else images
