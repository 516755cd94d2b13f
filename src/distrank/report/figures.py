"""Figure conventions: paper-sized matplotlib (Agg) figures saved as PDF and PNG.

- Sizes: a single column is :data:`SINGLE_COLUMN_IN` (3.5 in) wide, a full page
  width :data:`DOUBLE_COLUMN_IN` (7 in); fonts are 8-9 pt at that size, so a figure
  is read at 100 % and nothing is scaled down.
- Labels: every metric axis names the metric *and* the feature extractor
  (:func:`metric_label`). Fréchet and kernel distances are called FID/KID only on
  Inception-v3 features; on any other network they are FD/KD.
- Files: :func:`save` writes ``stem.pdf`` and ``stem.png`` atomically and without
  timestamps, so the same figure gives the same bytes.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from distrank.metrics.registry import DISPLAY, display  # noqa: E402
from distrank.report import atomic_write_bytes, output_path  # noqa: E402

__all__ = [
    "SINGLE_COLUMN_IN",
    "DOUBLE_COLUMN_IN",
    "PAPER_RC",
    "paper_style",
    "new_figure",
    "metric_name",
    "metric_label",
    "save",
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


@contextmanager
def paper_style() -> Iterator[None]:
    """Matplotlib settings for paper-sized figures, for drawing and saving alike."""
    with matplotlib.rc_context(PAPER_RC):
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
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(inches, height), squeeze=False, layout="constrained", **subplot_kw
    )
    return fig, axes


def metric_name(metric: str, extractor: str) -> str:
    """Display name on ``extractor``'s features (``metrics.registry.display``: FD/KD
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
        plt.close(fig)
    return paths
