"""Degradations with a known order (distrank.zoo.degrade)."""

import numpy as np
import pytest
from scipy import ndimage

from distrank.zoo.degrade import add_noise, blur, degrade, mode_drop


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 30)
    images = rng.integers(0, 256, size=(len(labels), 28, 28), dtype=np.uint8)
    return images, labels


def test_noise_std_matches_sigma():
    # Mid-grey images so clipping at 0 and 255 never bites at this sigma.
    images = np.full((200, 28, 28), 128, dtype=np.uint8)
    noisy, labels = add_noise(images, np.zeros(200, int), sigma=12.0, seed=1)
    diff = noisy.astype(np.float64) - images
    assert noisy.dtype == np.uint8 and labels.tolist() == [0] * 200
    assert abs(diff.mean()) < 0.1
    # Rounding to grey levels adds variance 1/12.
    assert diff.std() == pytest.approx(np.sqrt(12.0**2 + 1 / 12), rel=0.01)


def test_noise_is_seeded(data):
    images, labels = data
    a, _ = add_noise(images, labels, sigma=5, seed=3)
    assert np.array_equal(a, add_noise(images, labels, sigma=5, seed=3)[0])
    assert not np.array_equal(a, add_noise(images, labels, sigma=5, seed=4)[0])
    assert np.array_equal(add_noise(images, labels, sigma=0, seed=3)[0], images)


def test_blur_equals_gaussian_filter_per_image(data):
    images, labels = data
    out, out_labels = blur(images, labels, sigma=1.3)
    expected = [
        np.clip(np.round(ndimage.gaussian_filter(im.astype(float), 1.3)), 0, 255) for im in images
    ]
    assert out.dtype == np.uint8
    assert np.array_equal(out, np.array(expected, dtype=np.uint8))
    assert np.array_equal(out_labels, labels)
    # A channel axis is left alone.
    out4, _ = blur(images[..., None], labels, sigma=1.3)
    assert np.array_equal(out4[..., 0], out)


@pytest.mark.parametrize("kind, levels", [("noise", [0, 5, 20, 60]), ("blur", [0, 0.5, 1, 2])])
def test_levels_are_monotone(data, kind, levels):
    images, labels = data
    dist = [
        np.abs(degrade(kind, images, labels, level=lv, seed=0)[0].astype(float) - images).mean()
        for lv in levels
    ]
    assert dist[0] == 0 and np.all(np.diff(dist) > 0)


def test_mode_drop_removes_exactly_the_dropped_classes(data):
    images, labels = data
    kept_sets = []
    for n_drop in range(10):
        out, out_labels = mode_drop(images, labels, n_drop=n_drop, seed=5)
        assert out.shape == images.shape and out.dtype == np.uint8
        kept_sets.append(set(np.unique(out_labels).tolist()))
        assert len(kept_sets[-1]) == 10 - n_drop
        # Every output row is an input row of the same label.
        index = {im.tobytes(): lab for im, lab in zip(images, labels)}
        assert all(index[im.tobytes()] == lab for im, lab in zip(out, out_labels))
    # Nested: dropping more classes drops a superset.
    assert all(b < a for a, b in zip(kept_sets, kept_sets[1:]))


def test_mode_drop_keep_classes_and_balanced_reuse(data):
    images, labels = data
    out, out_labels = mode_drop(images, labels, keep_classes=[2, 7], seed=0, n=125)
    assert set(out_labels.tolist()) <= {2, 7} and len(out) == 125
    # 60 kept rows, 125 outputs: every row used twice, 5 of them three times.
    _, counts = np.unique(out.reshape(125, -1), axis=0, return_counts=True)
    assert sorted(set(counts.tolist())) == [2, 3] and np.sum(counts == 3) == 5
    assert np.array_equal(out, mode_drop(images, labels, keep_classes=[2, 7], seed=0, n=125)[0])


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"n_drop": 10}, "n_drop"),
        ({}, "n_drop"),
        ({"n_drop": 1, "keep_classes": [1]}, "n_drop"),
        ({"keep_classes": [11]}, "keep_classes"),
    ],
)
def test_mode_drop_errors(data, kwargs, key):
    images, labels = data
    with pytest.raises(
        ValueError,
        match=rf"^(argument '{key}' must be |give exactly one of the arguments 'n_drop' and 'keep_classes'$)",
    ):
        mode_drop(images, labels, seed=0, **kwargs)


def test_errors(data):
    images, labels = data
    with pytest.raises(ValueError, match=r"^argument 'images' must be uint8"):
        blur(images.astype(float), sigma=1)
    with pytest.raises(ValueError, match=r"^argument 'labels' must be 300 ints"):
        add_noise(images, labels[:-1], sigma=1, seed=0)
    with pytest.raises(ValueError, match=r"^argument 'sigma' must be >= 0"):
        add_noise(images, sigma=-1, seed=0)
    with pytest.raises(ValueError, match=r"^argument 'kind': unknown 'jpeg'"):
        degrade("jpeg", images, labels, level=1, seed=0)
