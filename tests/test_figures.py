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


def test_samples_grid_puts_each_models_first_image_of_each_class_in_its_cell():
    from distrank.figures import samples_grid

    labels = np.array([2, 0, 2, 1])
    images = np.stack([np.full((4, 4), 10 * (i + 1), np.uint8) for i in range(4)])
    dropped = (images[:2], np.array([0, 0]))  # classes 1 and 2 dropped
    fig = samples_grid({"a": (images, labels), "b": dropped}, [0, 1, 2], ["x", "y", "z"])
    ax = fig.axes[0]
    grid = np.asarray(ax.get_images()[0].get_array())
    assert grid.shape == (8, 12, 3)
    cell = lambda r, c: grid[4 * r : 4 * r + 4, 4 * c : 4 * c + 4]  # noqa: E731
    # model a: class 0 is row 1 (20), class 1 row 3 (40), class 2 row 0 (10)
    assert [int(cell(0, c).min()) for c in range(3)] == [20, 40, 10]
    assert int(cell(1, 0).max()) == 10 and (cell(1, 1) == 255).all() and (cell(1, 2) == 255).all()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["x", "y", "z"]
