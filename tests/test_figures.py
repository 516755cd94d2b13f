"""Figure conventions: labels name metric and extractor; saved bytes are deterministic."""

import hashlib

import numpy as np
import pytest

from distrank.figures import (
    DOUBLE_COLUMN_IN,
    metric_label,
    metric_name,
    new_figure,
    paper_style,
    save,
)


def _figure():
    with paper_style():
        fig, axes = new_figure(1, 2, width="double")
        x = np.linspace(0, 1, 50)
        axes[0, 0].plot(x, x**2)
        axes[0, 0].set_xlabel(metric_label("kd", "EfficientNet-Lite0", "all"))
        axes[0, 1].scatter(x, np.sin(x))
    return fig


def test_save_writes_pdf_and_png_with_identical_bytes(tmp_path):
    digests = []
    for run in range(2):
        paths = save(_figure(), tmp_path / f"run{run}" / "E9_demo")
        assert sorted(paths) == ["pdf", "png"]
        digests.append({k: hashlib.sha256(p.read_bytes()).hexdigest() for k, p in paths.items()})
    assert digests[0] == digests[1]
    pdf = (tmp_path / "run0" / "E9_demo.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"CreationDate" not in pdf
    assert (tmp_path / "run0" / "E9_demo.png").read_bytes().startswith(b"\x89PNG")


def test_paper_size_and_fonts():
    fig = _figure()
    assert fig.get_size_inches()[0] == pytest.approx(DOUBLE_COLUMN_IN)
    with paper_style():
        fig.canvas.draw()
        sizes = [
            t.get_fontsize() for ax in fig.axes for t in [ax.xaxis.label, *ax.get_xticklabels()]
        ]
    assert min(sizes) >= 8


@pytest.mark.parametrize(
    ("metric", "extractor", "expected"),
    [
        ("fd", "EfficientNet-Lite0", "FD"),
        ("kd", "DINOv2 ViT-L/14", "KD"),
        ("fd", "Inception-v3", "FID"),
        ("kd", "inception_v3 (torch-fidelity)", "KID"),
        ("recall", "Inception-v3", "Recall"),
    ],
)
def test_metric_names_follow_the_extractor(metric, extractor, expected):
    assert metric_name(metric, extractor) == expected
    assert (
        metric_label(metric, extractor, "avg")
        == rf"{expected}$_\mathrm{{avg}}$ on {extractor} features"
    )


def test_new_figure_rejects_unknown_width():
    with pytest.raises(ValueError, match=r"^width must be 'single', 'double' or inches"):
        new_figure(width="triple")
