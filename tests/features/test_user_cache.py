"""Weights, ONNX exports and features land in the user's cache, never in the current
folder; ``--weights-dir``, ``$DISTRANK_WEIGHTS_DIR`` and ``$DISTRANK_CACHE_DIR`` move them,
and the pipeline keeps its ``resources/weights``."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")

from distrank.cli import main  # noqa: E402
from distrank.features.base import extractor_from_config  # noqa: E402
from distrank.features.cache import default_cache_dir  # noqa: E402
from distrank.features.weights import (  # noqa: E402
    default_lockfile,
    study_weights_dir,
    weights_dir,
)

ENV = ("DISTRANK_WEIGHTS_DIR", "DISTRANK_CACHE_DIR", "XDG_CACHE_HOME")


@pytest.fixture
def user(tmp_path, monkeypatch):
    """A user standing in an empty folder ``here``, with their own HOME and no distrank
    variables set."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    home, here = tmp_path / "home", tmp_path / "here"
    home.mkdir()
    here.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    return home, here


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_the_defaults_are_the_user_cache(user, monkeypatch, tmp_path):
    home, _ = user
    assert weights_dir() == home / ".cache" / "distrank" / "weights"
    assert default_cache_dir() == home / ".cache" / "distrank" / "features"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert weights_dir() == tmp_path / "xdg" / "distrank" / "weights"
    assert default_cache_dir() == tmp_path / "xdg" / "distrank" / "features"
    monkeypatch.setenv("DISTRANK_CACHE_DIR", str(tmp_path / "cache"))
    assert weights_dir() == tmp_path / "cache" / "weights"
    assert default_cache_dir() == tmp_path / "cache"
    monkeypatch.setenv("DISTRANK_WEIGHTS_DIR", str(tmp_path / "env"))
    assert weights_dir() == tmp_path / "env"
    assert weights_dir(tmp_path / "arg") == tmp_path / "arg"
    for path in (weights_dir(), default_cache_dir()):
        assert path.is_absolute()


def test_the_study_keeps_resources_weights(user, monkeypatch, tmp_path):
    """A study config's null weights_dir is $DISTRANK_WEIGHTS_DIR, else resources/weights
    (relative to the workflow's root, where snakemake runs): never the user cache."""
    assert study_weights_dir(None) == Path("resources/weights")
    assert study_weights_dir("w") == Path("w")
    assert default_lockfile(Path("resources/weights")) == Path("resources/checksums.lock")
    assert default_lockfile(tmp_path / "w") == tmp_path / "w" / "checksums.lock"
    monkeypatch.setenv("DISTRANK_CACHE_DIR", str(tmp_path / "cache"))
    assert study_weights_dir(None) == Path("resources/weights")
    monkeypatch.setenv("DISTRANK_WEIGHTS_DIR", str(tmp_path / "env"))
    assert study_weights_dir(None) == tmp_path / "env"
    assert study_weights_dir("w") == Path("w")


def test_the_pipelines_extractor_exports_into_resources_weights(user, lite0_onnx):
    """extractor_from_config on the default study's features section (no weights_dir)
    finds its export in ./resources/weights/onnx (seeded there), and the user cache stays
    empty."""
    home, here = user
    seeded = here / "resources" / "weights" / "onnx" / lite0_onnx.onnx_path.name
    seeded.parent.mkdir(parents=True)
    shutil.copyfile(lite0_onnx.onnx_path, seeded)
    features = {"extractor": "efficientnet_lite0", "backend": "onnx", "batch_size": 8}
    extractor = extractor_from_config(features, threads=1)
    assert Path(extractor.onnx_path).resolve() == seeded.resolve()
    assert files_under(home) == []


@pytest.fixture
def folder(tmp_path, gray_images):
    images = tmp_path / "images"
    images.mkdir()
    for i, image in enumerate(gray_images[..., 0]):
        Image.fromarray(image).save(images / f"{i}.png")
    return images


def extract(folder: Path, out: Path, *options: str) -> np.ndarray:
    assert main(["extract", str(folder), "--out", str(out), "-q", *options]) == 0
    with np.load(out) as saved:
        return saved["features"]


def test_distrank_extract_writes_nothing_in_the_current_folder(user, folder, lite0_onnx):
    """A first run exports EfficientNet-Lite0 to ONNX under ~/.cache/distrank/weights and
    caches the features under ~/.cache/distrank/features; the current folder stays empty,
    and the features are those of an extractor exported elsewhere."""
    home, here = user
    got = extract(folder, folder.parent / "f.npz", "--backend", "onnx", "--batch-size", "4")
    assert files_under(here) == []
    cache = home / ".cache" / "distrank"
    export = cache / "weights" / "onnx" / lite0_onnx.onnx_path.name
    assert export.is_file()
    assert any(name.startswith("features/") for name in files_under(cache))
    assert {name.split("/")[0] for name in files_under(cache)} == {"weights", "features"}
    images = [np.asarray(Image.open(p)) for p in sorted(folder.glob("*.png"))]
    want = lite0_onnx.extract(np.stack(images)[..., None])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("how", ["--weights-dir", "DISTRANK_WEIGHTS_DIR", "DISTRANK_CACHE_DIR"])
def test_the_weights_folder_can_be_moved(user, folder, lite0_onnx, monkeypatch, tmp_path, how):
    """With the export seeded where an option or a variable points, the run uses it (no
    export is made in the user cache) and the current folder stays empty."""
    home, here = user
    target = tmp_path / "elsewhere"
    weights = target / "weights" if how == "DISTRANK_CACHE_DIR" else target
    (weights / "onnx").mkdir(parents=True)
    shutil.copyfile(lite0_onnx.onnx_path, weights / "onnx" / lite0_onnx.onnx_path.name)
    options = ["--backend", "onnx", "--no-cache"]
    if how == "--weights-dir":
        options += ["--weights-dir", str(target)]
    else:
        monkeypatch.setenv(how, str(target))
    extract(folder, tmp_path / "f.npz", *options)
    assert files_under(here) == [] and files_under(home) == []
    kept = files_under(weights)  # the export, and the 28 px images' resize matrix beside it
    assert kept[0] == f"onnx/{lite0_onnx.onnx_path.name}"
    assert [name.split("-")[:2] for name in kept[1:]] == [["onnx/resize", "bilinear"]]
