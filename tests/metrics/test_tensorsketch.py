"""TensorSketch of KID's cubic kernel against closed forms: psi(x) is the count sketch
of x'^(x)3 under the summed hash (formed here from the tensor itself), so
E[psi(x).psi(y)] = (gamma <x, y> + coef0)^3 and the sketched KD is unbiased for KID's
U-statistic (numpy's kernel matrices); the deterministic norm bound and the clips."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distrank.metrics.sketch._tensorsketch import TensorSketchMap, tensorsketch_kd


def poly(a, b, gamma, coef0=1.0):
    return (gamma * a @ b.T + coef0) ** 3


def exact_kid(x, y, gamma) -> float:
    """KID's unbiased (U) KD from the kernel matrices."""

    def u(a):
        k = poly(a, a, gamma)
        return (k.sum() - np.trace(k)) / (len(a) * (len(a) - 1))

    return u(x) + u(y) - 2 * poly(x, y, gamma).mean()


@pytest.fixture(scope="module")
def samples():
    rng = np.random.default_rng(0)
    return np.abs(rng.normal(size=(40, 4))), np.abs(rng.normal(0.3, 1.2, size=(30, 4)))


def test_psi_is_the_count_sketch_of_the_cubed_tensor():
    fmap = TensorSketchMap(4, 8, gamma=0.7, coef0=2.0, seed=5)
    x = np.random.default_rng(1).normal(size=(3, 4))
    xa = np.concatenate([math.sqrt(0.7) * x, np.full((3, 1), math.sqrt(2.0))], axis=1)
    h, s = fmap.hashes, fmap.signs
    expected = np.zeros((3, 8))
    for a in range(5):
        for b in range(5):
            for c in range(5):
                bucket = (h[0, a] + h[1, b] + h[2, c]) % 8
                expected[:, bucket] += s[0, a] * s[1, b] * s[2, c] * xa[:, a] * xa[:, b] * xa[:, c]
    np.testing.assert_allclose(fmap.features(x), expected, atol=1e-12)
    # the sum of the coordinates (the DC term) is the product of the three signed sums
    np.testing.assert_allclose(fmap.features(x).sum(axis=1), np.prod(xa @ s.T, axis=1))


def test_psi_is_unbiased_for_the_cubic_kernel():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(2, 6))
    draws = []
    for seed in range(3000):
        psi = TensorSketchMap(6, 16, gamma=0.3, seed=seed).features(np.stack([x, y]))
        draws.append(psi[0] @ psi[1])
    se = np.std(draws, ddof=1) / math.sqrt(len(draws))
    assert abs(np.mean(draws) - (0.3 * x @ y + 1) ** 3) < 4 * se


def test_the_kd_is_the_u_statistic_of_the_sketched_kernel(samples):
    x, y = samples
    fmap = TensorSketchMap(4, 32, seed=1)
    px, py = fmap.features(x), fmap.features(y)

    def u(p):
        k = p @ p.T
        return (k.sum() - np.trace(k)) / (len(p) * (len(p) - 1))

    direct = u(px) + u(py) - 2 * (px @ py.T).mean()
    assert tensorsketch_kd(fmap.sketch(x), fmap.sketch(y, block_rows=7)) == pytest.approx(direct)


def test_the_sketched_kd_is_unbiased_for_kid(samples):
    x, y = samples
    draws = [
        tensorsketch_kd(*(TensorSketchMap(4, 64, seed=seed).sketch(a) for a in (x, y)))
        for seed in range(500)
    ]
    se = np.std(draws, ddof=1) / math.sqrt(len(draws))
    assert abs(np.mean(draws) - exact_kid(x, y, 0.25)) < 4 * se


def test_the_norm_bound_holds_and_clips_bound_the_rows():
    rng = np.random.default_rng(3)
    fmap = TensorSketchMap(8, 16, clip_norm=2.0, seed=4)
    x = np.concatenate([rng.normal(size=(200, 8)) * 5, fmap.signs[:1, :8] * 9.0])
    psi = np.linalg.norm(fmap.features(x), axis=1)
    assert psi.max() <= fmap.norm_bound()
    assert np.linalg.norm(fmap.augment(x)[:, :8], axis=1).max() <= 2.0 * math.sqrt(1 / 8) + 1e-12
    clipped = TensorSketchMap(8, 16, clip_norm=2.0, seed=4, feature_norm=0.5 * psi.mean())
    assert np.linalg.norm(clipped.features(x), axis=1).max() <= 0.5 * psi.mean() * (1 + 1e-12)
    assert clipped.norm_bound() == 0.5 * psi.mean()


def test_nested_maps_share_hashes_and_maps_must_match(samples):
    x, _ = samples
    big, small = TensorSketchMap(4, 64, seed=2), TensorSketchMap(4, 16, seed=2)
    np.testing.assert_array_equal(big.hashes % 16, small.hashes)
    with pytest.raises(ValueError, match="'dim' differs"):
        tensorsketch_kd(big.sketch(x), small.sketch(x))
    with pytest.raises(ValueError, match="coef0"):
        TensorSketchMap(4, 16, coef0=-1.0)
