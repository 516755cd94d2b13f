"""Figure conventions: paper-sized matplotlib (Agg) figures saved as PDF and PNG.

- Sizes: a single column is ``SINGLE_COLUMN_IN`` (3.5 in) wide, a full page
  width ``DOUBLE_COLUMN_IN`` (7 in); fonts are 8-9 pt at that size, so a figure
  is read at 100 % and nothing is scaled down.
- Labels: every metric axis names the metric *and* the feature extractor
  (:func:`metric_label`). Fréchet and kernel distances are called FID/KID only on
  Inception-v3 features; on any other network they are FD/KD.
- Files: :func:`save` writes ``stem.pdf`` and ``stem.png`` atomically and without
  timestamps, so the same figure gives the same bytes.

It also holds the figures that more than one layer draws: E1's and E6's all-vs-avg
scatters (:func:`e1_figure`, :func:`e6_figure`) and the per-model tables they draw
(:func:`per_model`, :func:`e1_table`, :func:`e6_table`), which the experiments save and
the consistency page of ``distrank report`` redraws for the user's models.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

import distrank.metrics._table
from distrank._io import atomic_write_bytes, output_path
from distrank.metrics._metric import PRDC
from distrank.metrics._ranking import discordant_pairs, rank_models
from distrank.metrics._registry import DISPLAY, HIGHER_IS_BETTER, display

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "SINGLE_COLUMN_IN",
    "DOUBLE_COLUMN_IN",
    "PAPER_RC",
    "paper_style",
    "new_figure",
    "metric_name",
    "metric_label",
    "save",
    "per_model",
    "e1_table",
    "e1_figure",
    "e6_table",
    "e6_figure",
    "samples_grid",
]

SINGLE_COLUMN_IN = 3.5
DOUBLE_COLUMN_IN = 7.0

PAPER_RC: dict[str, object] = {
    "font.family": "DejaVu Sans",
    "font.size": 8,
    "axes.titlesize": 9,
    "axes.labelsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.2,
    "lines.markersize": 4,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.02,
    "pdf.fonttype": 42,  # TrueType, editable text in the PDF
    "svg.hashsalt": "distrank",
    "path.simplify": False,
}


def _pyplot():
    """matplotlib's pyplot on the Agg backend, imported on first use: the Snakefile's
    parse imports the experiments, and so this module, and draws nothing (0.35 s)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt


@contextmanager
def paper_style() -> Iterator[None]:
    """Matplotlib settings for paper-sized figures, for drawing and saving alike."""
    with _pyplot().rc_context(PAPER_RC):
        yield


def new_figure(
    nrows: int = 1,
    ncols: int = 1,
    *,
    width: str | float = "single",
    height: float | None = None,
    **subplot_kw: object,
) -> tuple[Figure, np.ndarray]:
    """A figure ``width`` wide ("single", "double" or inches) with an axes grid.

    ``height`` defaults to a panel aspect of about 0.8 (height/width). Axes come
    back as a 2-D array (``squeeze=False``). Call inside :func:`paper_style`.
    """
    inches = {"single": SINGLE_COLUMN_IN, "double": DOUBLE_COLUMN_IN}.get(width, width)
    if not isinstance(inches, (int, float)):
        raise ValueError(f"width must be 'single', 'double' or inches, got {width!r}")
    if height is None:
        height = 0.8 * inches / ncols * nrows
    fig, axes = _pyplot().subplots(
        nrows, ncols, figsize=(inches, height), squeeze=False, layout="constrained", **subplot_kw
    )
    return fig, axes


def metric_name(metric: str, extractor: str) -> str:
    """Display name on ``extractor``'s features (``metrics._registry.display``: FD/KD
    become FID/KID only on Inception features); a key in capitals is accepted."""
    key = metric.lower()
    return display(key, extractor) if key in DISPLAY else metric


#: How the extractors of distrank.features are named on axes.
EXTRACTOR_NAMES = {
    "efficientnet_lite0": "EfficientNet-Lite0",
    "inception": "Inception-v3",
    "dinov2_vits14": "DINOv2 ViT-S/14",
    "dinov2_vitb14": "DINOv2 ViT-B/14",
    "dinov2_vitl14": "DINOv2 ViT-L/14",
}


def metric_label(metric: str, extractor: str, aggregation: str | None = None) -> str:
    r"""Axis label such as ``KD$_\mathrm{avg}$ on EfficientNet-Lite0 features``."""
    name = metric_name(metric, extractor)
    if aggregation:
        name = rf"{name}$_\mathrm{{{aggregation}}}$"
    return f"{name} on {EXTRACTOR_NAMES.get(extractor, extractor)} features"


def save(
    fig: Figure, stem: str | os.PathLike[str], *, dpi: int = 200, close: bool = True
) -> dict[str, Path]:
    """Write ``stem.pdf`` and ``stem.png`` (``dpi``) atomically, without timestamps.

    Returns the paths keyed by ``"pdf"`` and ``"png"``. Closes ``fig`` unless
    ``close=False``.
    """
    metadata = {
        "pdf": {"CreationDate": None, "ModDate": None},
        "png": {"Software": None},
    }
    paths = {}
    with paper_style():
        for kind in ("pdf", "png"):
            buf = io.BytesIO()
            fig.savefig(buf, format=kind, dpi=dpi, metadata=metadata[kind])
            paths[kind] = atomic_write_bytes(output_path(stem, f".{kind}"), buf.getvalue())
    if close:
        _pyplot().close(fig)
    return paths


# --- tables and figures shared by the experiments and the report -----------------------


def per_model(
    scores: pd.DataFrame, metrics: Sequence[str], *, difference: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per model and the per-metric rank agreement (:func:`~distrank.metrics.rank_agreement`).

    Columns: ``model``; per metric ``<M>_all``, ``<M>_avg`` and ``<M>_gap``
    (``avg - all``, ``difference="gap"``) or ``<M>_absdiff`` (``|all - avg|``); then
    ``<M>_all_rank``, ``<M>_avg_rank`` (1 = best). Rows are sorted by model name.
    """
    if difference not in ("gap", "absdiff"):
        raise ValueError(f"difference: expected 'gap' or 'absdiff', got {difference!r}")
    wide = distrank.metrics._table.wide(scores, metrics)
    names = [display(m) for m in metrics]
    table = wide[["model"]].copy()
    for name in names:
        all_, avg = wide[f"{name}_all"], wide[f"{name}_avg"]
        table[f"{name}_all"], table[f"{name}_avg"] = all_, avg
        table[f"{name}_{difference}"] = avg - all_ if difference == "gap" else (all_ - avg).abs()
    for metric, name in zip(metrics, names):
        for agg in ("all", "avg"):
            table[f"{name}_{agg}_rank"] = rank_models(
                wide[f"{name}_{agg}"], higher_is_better=HIGHER_IS_BETTER[metric]
            )
    return table, distrank.metrics._table.rank_agreement(wide, metrics)


def e1_table(
    scores: pd.DataFrame, metrics: Sequence[str] = ("kd", "fd")
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-model aggregates and per-metric rank agreement for E1.

    Parameters
    ----------
    scores : tidy score table (``model, metric, aggregation, client, value``) with
        ``all`` and ``avg`` rows for every model and metric.
    metrics : metric keys to tabulate, distances first (``"kd"``, ``"fd"``).

    Returns
    -------
    per_model : :func:`per_model` with ``<M>_gap`` (``avg - all``),
        sorted by the first metric's ``all`` rank (best first).
    agreement : per metric ``kendall_tau`` (tau-b of avg vs all), ``p_value``,
        ``n_models``, ``rank_flips`` (discordant model pairs).
    """
    table, agreement = per_model(scores, metrics, difference="gap")
    first = display(metrics[0])
    table = table.sort_values([f"{first}_all_rank", "model"], kind="mergesort").reset_index(
        drop=True
    )
    return table, agreement


def _slope_one_fit(ax, x: np.ndarray, y: np.ndarray, unit: str) -> float:
    """Least-squares line of slope 1 (intercept = mean gap); returns the gap."""
    gap = float(np.mean(y - x))
    lo, hi = float(np.min(x)), float(np.max(x))
    pad = 0.05 * (hi - lo if hi > lo else abs(hi) or 1.0)
    xs = np.array([lo - pad, hi + pad])
    spread = float(np.ptp(y - x))
    ax.plot(
        xs,
        xs + gap,
        color="0.45",
        lw=0.9,
        ls="--",
        zorder=1,
        label=f"slope 1, mean {unit} gap {gap:.3g}\n(max - min gap {spread:.2g})",
    )
    return gap


def e1_figure(table: pd.DataFrame, extractor: str, *, kd: str = "kd", fd: str = "fd") -> Figure:
    """Two panels, double column: KD_avg vs KD_all, FD_avg vs FD_all.

    Left: the models lie on a line of slope 1 (the fitted line's intercept is the
    mean gap; "gap range" is max - min of the gaps, zero up to rounding for KD).
    Right: the same for FD, with every pair of models that FD_avg and FD_all order
    differently joined by a red line (rank flip).

    ``table`` is the ``per_model`` output of :func:`e1_table`; ``extractor`` names
    the feature network for the axis labels (e.g. ``"EfficientNet-Lite0"``).
    """
    with paper_style():
        fig, axes = new_figure(1, 2, width="double", height=2.9)
        for ax, metric, flips in ((axes[0, 0], kd, False), (axes[0, 1], fd, True)):
            name = display(metric)
            x = table[f"{name}_all"].to_numpy(float)
            y = table[f"{name}_avg"].to_numpy(float)
            _slope_one_fit(ax, x, y, metric_name(metric, extractor))
            if flips:
                pairs = discordant_pairs(x, y)
                for k, (i, j) in enumerate(pairs):
                    ax.plot(
                        [x[i], x[j]],
                        [y[i], y[j]],
                        color="tab:red",
                        lw=0.8,
                        alpha=0.8,
                        zorder=2,
                        label=f"rank flip ({len(pairs)} pairs)" if k == 0 else None,
                    )
            _model_points(ax, x, y)
            ax.set_xlabel(metric_label(metric, extractor, "all"))
            ax.set_ylabel(metric_label(metric, extractor, "avg"))
            ax.legend(loc="upper left")
        axes[0, 0].set_title("(a) Kernel distance", loc="left")
        axes[0, 1].set_title("(b) Fréchet distance", loc="left")
    return fig


def _model_points(ax, x, y) -> None:
    """One point per model, over the lines of the E1 and E6 panels."""
    ax.scatter(
        x, y, s=16, color="tab:blue", edgecolor="white", linewidth=0.4, zorder=3,
        label=f"model ({len(x)})",
    )  # fmt: skip


def e6_table(
    scores: pd.DataFrame, metrics: Sequence[str] = PRDC
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-model PRDC in both aggregations, and per-metric rank agreement.

    Returns
    -------
    per_model : :func:`per_model` with ``<M>_absdiff``
        (:math:`|all - avg|`), sorted by model name.
    agreement : per metric ``kendall_tau`` (avg vs all), ``p_value``, ``n_models``,
        ``rank_flips``, ``max_absdiff`` (largest :math:`|all - avg|` over models).
    """
    table, agreement = per_model(scores, metrics, difference="absdiff")
    agreement["max_absdiff"] = [float(table[f"{display(m)}_absdiff"].max()) for m in metrics]
    return table, agreement


def e6_figure(table: pd.DataFrame, extractor: str, metrics: Sequence[str] = PRDC) -> Figure:
    """2 x 2 scatter, one panel per metric: avg (y) against all (x), one point per
    model, with the diagonal y = x (where Recall's points lie exactly); both axes of
    a panel share their limits. Panels do not share scales (density is not bounded
    by one). ``table`` is ``per_model`` of
    :func:`e6_table`."""
    if len(metrics) != 4:
        raise ValueError(f"e6_figure draws four panels, got metrics {list(metrics)}")
    with paper_style():
        fig, axes = new_figure(2, 2, width="double", height=5.4)
        for letter, ax, metric in zip("abcd", axes.flat, metrics):
            name = display(metric)
            x = table[f"{name}_all"].to_numpy(float)
            y = table[f"{name}_avg"].to_numpy(float)
            lo, hi = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
            pad = 0.08 * (hi - lo if hi > lo else 1.0)
            lims = (lo - pad, hi + pad)
            ax.plot(lims, lims, color="0.5", lw=0.8, ls="--", zorder=1, label="avg = all")
            _model_points(ax, x, y)
            ax.set_xlim(lims)
            ax.set_ylim(lims)
            ax.set_xlabel(metric_label(metric, extractor, "all"))
            ax.set_ylabel(metric_label(metric, extractor, "avg"))
            ax.set_title(
                f"({letter}) {name}: max |all - avg| = {np.max(np.abs(x - y)):.2g}", loc="left"
            )
            ax.legend(loc="best")  # points may sit anywhere off the diagonal
    return fig


def samples_grid(
    samples: Mapping[str, tuple[np.ndarray, np.ndarray | None]],
    classes: Sequence[int],
    class_names: Sequence[str] | None = None,
) -> Figure:
    """One row per model (``samples``: name -> (uint8 images (N, H, W[, C]), labels or
    None)), one column per class of ``classes``: the model's first image of that class,
    blank where it has none (a dropped mode); unlabelled models show their first
    images. Columns are titled by ``class_names`` (indexed by class) when given."""
    side = next(iter(samples.values()))[0].shape[1]
    rows = []
    for images, labels in samples.values():
        picks = [
            np.flatnonzero(labels == c)[:1] if labels is not None else [i]
            for i, c in enumerate(classes)
        ]
        cells = [
            _rgb(images[p[0]]) if len(p) and p[0] < len(images) else np.full((side, side, 3), 255)
            for p in picks
        ]
        rows.append(np.concatenate(cells, axis=1))
    with paper_style():
        width = DOUBLE_COLUMN_IN
        fig, axes = new_figure(width=width, height=width * len(rows) / len(classes) + 0.5)
        ax = axes[0, 0]
        ax.imshow(np.concatenate(rows).astype(np.uint8), interpolation="nearest")
        ax.set_yticks([side * (i + 0.5) for i in range(len(rows))], list(samples))
        names = [class_names[c] if class_names else str(c) for c in classes]
        ax.set_xticks([side * (i + 0.5) for i in range(len(classes))], names, rotation=30)
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
    return fig


def _rgb(image: np.ndarray) -> np.ndarray:
    """(H, W) or (H, W, 1) grey, or (H, W, 3) colour, as (H, W, 3)."""
    if image.ndim == 3 and image.shape[2] == 3:
        return image
    return np.repeat(image.reshape(image.shape[:2] + (1,)), 3, axis=2)
