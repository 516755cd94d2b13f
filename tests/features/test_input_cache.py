"""Features of image folders and npz batches through the cache (cached_input_features)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("torch")

from distrank.data.folders import open_images  # noqa: E402
from distrank.features.base import Extractor  # noqa: E402
from distrank.features.cache import cached_input_features, meta_path  # noqa: E402


class Moments(Extractor):
    """Deterministic per-image features (mean, std, height): any batch gives the same rows."""

    name = "moments"
    dim = 3
    backend = "torch"
    device = "cpu"

    def __init__(self, gain=1.0):
        self.gain, self.calls = gain, 0

    preprocessing = property(lambda self: {"gain": self.gain})
    weights = property(lambda self: {"file": "none", "sha256": "0" * 64})
    versions = property(lambda self: {"numpy": np.__version__})

    def forward_batch(self, images):
        self.calls += 1
        x = images.astype(np.float32)
        height = np.full(len(images), images.shape[1], np.float32)
        return np.stack([self.gain * x.mean(axis=(1, 2, 3)), x.std(axis=(1, 2, 3)), height], 1)


@pytest.fixture
def folder(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    root.mkdir()
    images = []
    for i, (h, w) in enumerate([(5, 5), (7, 4), (5, 5), (9, 9), (7, 4)]):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{i}.png")
        images.append(pixels)
    return root, images


def test_features_equal_per_image_extraction_and_are_reused(folder, tmp_path):
    root, images = folder
    ex = Moments()
    want = np.concatenate([ex.extract(image[None]) for image in images])
    ex.calls = 0
    image_input, _ = open_images(root)
    cache = tmp_path / "cache"
    got, meta = cached_input_features(image_input, ex, cache_dir=cache, batch_size=4, workers=2)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert ex.calls == 4  # rows 0-3 in three size groups, then row 4
    assert meta["n"] == 5 and meta["input_shape"] is None and meta["extractor"] == "moments"
    (file,) = cache.glob("*.npz")
    assert json.loads(meta_path(file).read_text()) == meta
    again, _ = cached_input_features(image_input, ex, cache_dir=cache, batch_size=1)
    np.testing.assert_array_equal(again, got)
    assert ex.calls == 4  # read back, not recomputed


def test_a_changed_image_or_extractor_recomputes(folder, tmp_path):
    root, images = folder
    cache = tmp_path / "cache"
    ex = Moments()
    first, _ = cached_input_features(open_images(root)[0], ex, cache_dir=cache)
    other, _ = cached_input_features(open_images(root)[0], Moments(gain=2.0), cache_dir=cache)
    np.testing.assert_allclose(other[:, 0], 2 * first[:, 0], rtol=1e-6)
    assert len(list(cache.glob("*.npz"))) == 2  # one file per (input, extractor options)
    Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(root / "0.png")
    calls = ex.calls
    changed, _ = cached_input_features(open_images(root)[0], ex, cache_dir=cache)
    assert ex.calls > calls and changed[0, 0] == 0 and np.array_equal(changed[1:], first[1:])


def test_image_npz_input(tmp_path):
    images = np.random.default_rng(1).integers(0, 256, (6, 4, 4, 1), dtype=np.uint8)
    np.savez(tmp_path / "batch.npz", arr_0=images)
    ex = Moments()
    got, meta = cached_input_features(
        open_images(tmp_path / "batch.npz")[0], ex, cache_dir=tmp_path / "cache", batch_size=4
    )
    np.testing.assert_array_equal(got, ex.extract(images))
    assert meta["input_shape"] == [6, 4, 4, 1]
