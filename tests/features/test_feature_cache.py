"""Feature files: sidecar metadata, exact-match reuse, recompute on any mismatch, atomic writes."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from distrank.features.base import Extractor  # noqa: E402
from distrank.features.cache import (  # noqa: E402
    cached_features,
    extract_to_file,
    load_features,
    meta_path,
    read_array,
    read_meta,
    requested_metadata,
)


class MeanColour(Extractor):
    """A tiny deterministic extractor: per-channel means and a scaled copy; counts its calls."""

    name = "mean_colour"
    dim = 2
    backend = "torch"
    device = "cpu"

    def __init__(self, gain=1.0):
        self.gain = gain
        self.calls = 0

    @property
    def preprocessing(self):
        return {"gain": self.gain}

    @property
    def weights(self):
        return {"file": "none", "sha256": "0" * 64}

    @property
    def versions(self):
        return {"numpy": np.__version__}

    def forward_batch(self, images):
        self.calls += 1
        m = images.astype(np.float32).mean(axis=(1, 2, 3))
        return np.stack([m, self.gain * m], axis=1)


@pytest.fixture
def image_file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "images.npz"
    np.savez_compressed(
        path,
        images=rng.integers(0, 256, (10, 8, 8, 1), dtype=np.uint8),
        labels=np.arange(10, dtype=np.int64) % 3,
    )
    return path


def test_extract_to_file_writes_features_labels_and_sidecar(image_file, tmp_path):
    out = tmp_path / "feats" / "real.npz"
    meta = extract_to_file(
        image_file, out, MeanColour(), batch_size=3, extra_meta={"dataset": "toy", "split": "train"}
    )
    feats, labels, stored = load_features(out), read_array(out, "labels"), read_meta(out)
    assert feats.shape == (10, 2) and feats.dtype == np.float32
    np.testing.assert_array_equal(labels, np.arange(10) % 3)
    assert stored == meta == json.loads(meta_path(out).read_text())
    assert meta_path(out).name == "real.npz.meta.json"
    for key in (
        "extractor",
        "backend",
        "preprocessing",
        "d",
        "n",
        "input_sha256",
        "versions",
        "weights",
    ):
        assert key in meta
    assert (
        meta["n"] == 10 and meta["d"] == 2 and meta["dataset"] == "toy" and meta["labels"] is True
    )
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "real.npz",
        "real.npz.meta.json",
    ]  # no temp files


def test_labels_absent_stays_absent(tmp_path):
    path = tmp_path / "nolabels.npz"
    np.savez(path, images=np.zeros((3, 4, 4, 3), dtype=np.uint8))
    out = tmp_path / "f.npz"
    meta = extract_to_file(path, out, MeanColour())
    with np.load(out) as data:
        assert "labels" not in data.files and meta["labels"] is False


def test_cache_reuses_only_exact_metadata(image_file, tmp_path):
    out = tmp_path / "f.npz"
    ex = MeanColour()
    first = cached_features(image_file, out, ex, extra_meta={"split": "train"})
    assert ex.calls > 0
    calls = ex.calls
    again = cached_features(image_file, out, ex, extra_meta={"split": "train"})
    assert ex.calls == calls  # reused
    np.testing.assert_array_equal(first, again)

    # another preprocessing -> recomputed, with the new values
    other = MeanColour(gain=2.0)
    feats = cached_features(image_file, out, other, extra_meta={"split": "train"})
    assert other.calls > 0
    np.testing.assert_allclose(feats[:, 1], 2 * feats[:, 0])
    assert read_meta(out)["preprocessing"] == {"gain": 2.0}

    # other extra metadata -> recomputed
    calls = other.calls
    cached_features(image_file, out, other, extra_meta={"split": "test"})
    assert other.calls > calls


def test_cache_recomputes_when_images_change(image_file, tmp_path):
    out = tmp_path / "f.npz"
    ex = MeanColour()
    cached_features(image_file, out, ex)
    calls = ex.calls
    np.savez_compressed(image_file, images=np.full((10, 8, 8, 1), 7, dtype=np.uint8))
    feats = cached_features(image_file, out, ex)
    assert ex.calls > calls
    np.testing.assert_allclose(feats[:, 0], 7.0)


@pytest.mark.parametrize(
    "damage",
    [
        "sidecar_missing",
        "sidecar_garbage",
        "sidecar_edited",
        "features_missing",
        "features_wrong_shape",
    ],
)
def test_cache_never_trusts_a_damaged_entry(image_file, tmp_path, damage):
    out = tmp_path / "f.npz"
    ex = MeanColour()
    want = cached_features(image_file, out, ex)
    calls = ex.calls
    sidecar = meta_path(out)
    if damage == "sidecar_missing":
        sidecar.unlink()
    elif damage == "sidecar_garbage":
        sidecar.write_text("{not json")
    elif damage == "sidecar_edited":
        meta = json.loads(sidecar.read_text())
        meta["preprocessing"] = {"gain": 3.0}
        sidecar.write_text(json.dumps(meta))
    elif damage == "features_missing":
        out.unlink()
    elif damage == "features_wrong_shape":
        np.savez(out, features=np.zeros((3, 2), dtype=np.float32))
    got = cached_features(image_file, out, ex)
    assert ex.calls > calls
    np.testing.assert_array_equal(got, want)


def test_requested_metadata_validates(image_file, tmp_path):
    with pytest.raises(ValueError, match=r"^extra_meta may not set the reserved keys \['n'\]$"):
        requested_metadata(image_file, MeanColour(), {"n": 5})
    bad = tmp_path / "bad.npz"
    np.savez(bad, images=np.zeros((2, 4, 4), dtype=np.uint8))
    with pytest.raises(
        ValueError,
        match=r"bad\.npz: 'images' must be uint8 \(N, H, W, C\) with C = 1 or 3, got uint8 \(2, 4, 4\)$",
    ):
        requested_metadata(bad, MeanColour())
    np.savez(bad, pictures=np.zeros((2, 4, 4, 1), dtype=np.uint8))
    with pytest.raises(ValueError, match="no 'images'"):
        requested_metadata(bad, MeanColour())


def test_failed_extraction_leaves_no_stale_sidecar(image_file, tmp_path):
    out = tmp_path / "f.npz"
    cached_features(image_file, out, MeanColour())

    class Broken(MeanColour):
        def forward_batch(self, images):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match=r"^boom$"):
        cached_features(image_file, out, Broken(gain=5.0))
    # the old entry is intact (still describing the old features) and no temp files remain
    assert json.loads(meta_path(out).read_text())["preprocessing"] == {"gain": 1.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.npz", "f.npz.meta.json", "images.npz"]


def test_real_extractor_round_trip(lite0_onnx, gray_images, tmp_path):
    path = tmp_path / "gray.npz"
    np.savez_compressed(path, images=gray_images, labels=np.arange(len(gray_images)))
    feats = cached_features(
        path, tmp_path / "f.npz", lite0_onnx, batch_size=4, extra_meta={"source": "test"}
    )
    np.testing.assert_array_equal(feats, lite0_onnx.extract(gray_images, batch_size=4))
    meta = read_meta(tmp_path / "f.npz")
    assert (
        meta["extractor"] == "efficientnet_lite0"
        and meta["backend"] == "onnx"
        and meta["d"] == 1280
    )


def test_extract_batches_matches_extract():
    torch = pytest.importorskip("torch")
    images = np.random.default_rng(2).integers(0, 256, (7, 5, 5, 3), dtype=np.uint8)
    ex = MeanColour()
    batches = [images[:4], torch.from_numpy(images[4:])]  # numpy or a DataLoader's uint8 tensors
    np.testing.assert_array_equal(
        np.concatenate(list(ex.extract_batches(batches))), ex.extract(images)
    )
    with pytest.raises(ValueError, match=r"^batch_size must be a positive integer"):
        ex.extract(images, batch_size=0)


def test_one_reader_names_file_and_key(tmp_path):
    """load_features is the package's one reader of feature npz files: every problem is
    an InputError carrying the file and the key."""
    from distrank._checks import InputError

    path = tmp_path / "x.npz"
    np.savez(path, features=np.ones((3, 2), np.float32), labels=np.arange(3))
    np.testing.assert_array_equal(load_features(path), np.ones((3, 2)))
    np.testing.assert_array_equal(read_array(path, "labels"), np.arange(3))
    assert read_meta(path) == {}
    for key, reason in (("labels", "'labels' has shape (3,)"), ("nope", "no 'nope' array")):
        with pytest.raises(InputError) as err:
            load_features(path, key)
        assert (err.value.path, err.value.key) == (path, key)
        assert str(err.value).startswith(f"{path}: {reason}")
    with pytest.raises(InputError, match="has dimension 2, but the reference ref.npz has 5"):
        load_features(path, d=5, d_source="ref.npz")
