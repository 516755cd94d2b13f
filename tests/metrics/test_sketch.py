"""Kernel mean sketches against closed forms: E_W[phi(x).phi(y)] is the rbf kernel, so
the sketched KD is an unbiased estimate of the exact U-statistic (scipy's distances);
|phi| = 1 and the release's sensitivity 2/n; the release's noise is the analytic
calibration (dp-accounting), its variance checked by a chi-square interval."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats
from scipy.spatial.distance import cdist

from distrank.metrics.sketch import _maps as sketch

H = 3.0


def exact_kd(x, y, h=H) -> float:
    """The unbiased (U) KD of the rbf kernel, from scipy's pairwise distances."""

    def k(a, b):
        return np.exp(-cdist(a, b, "sqeuclidean") / (2 * h * h))

    def u(a):
        kk = k(a, a)
        return (kk.sum() - np.trace(kk)) / (len(a) * (len(a) - 1))

    return u(x) + u(y) - 2 * k(x, y).mean()


@pytest.fixture(scope="module")
def samples():
    rng = np.random.default_rng(0)
    return rng.normal(size=(120, 5)), rng.normal(0.4, 1.3, size=(90, 5))


def test_the_sketched_kd_is_unbiased_for_the_exact_u_statistic(samples):
    x, y = samples
    draws = [
        sketch.sketch_kd(*(sketch.FeatureMap(5, 64, H, seed).sketch(a) for a in (x, y)))
        for seed in range(400)
    ]
    se = np.std(draws, ddof=1) / math.sqrt(len(draws))
    assert abs(np.mean(draws) - exact_kd(x, y)) < 4 * se


def test_the_sketched_kd_tends_to_the_exact_one_as_d_grows(samples):
    x, y = samples
    exact = exact_kd(x, y)
    errors = []
    for dim in (64, 4096, 65536):
        fmap = sketch.FeatureMap(5, dim, H, seed=3)
        errors.append(abs(sketch.sketch_kd(fmap.sketch(x), fmap.sketch(y)) - exact) / exact)
    assert errors[-1] < 0.02 and errors[-1] < errors[0]


def test_features_have_unit_norm_and_maps_nest(samples):
    x, _ = samples
    big, small = sketch.FeatureMap(5, 512, H, seed=9), sketch.FeatureMap(5, 128, H, seed=9)
    assert np.allclose(np.linalg.norm(big.features(x), axis=1), 1.0, atol=1e-12)
    assert np.array_equal(big.frequencies()[:, :64], small.frequencies())
    blocked = big.sketch(x, block_rows=7).mean
    assert np.allclose(blocked, big.features(x).mean(axis=0), atol=1e-15)


def test_one_replaced_row_moves_a_sketch_by_at_most_two_over_n(samples):
    x, _ = samples
    fmap = sketch.FeatureMap(5, 256, H, seed=1)
    far = x.copy()
    far[0] = 50.0
    move = np.linalg.norm(fmap.sketch(x).mean - fmap.sketch(far).mean)
    assert 0 < move <= 2 / len(x)


def test_the_release_noise_is_the_analytic_calibration(samples):
    x, _ = samples
    made = sketch.FeatureMap(5, 512, H, seed=2).sketch(x)
    z = dp_accounting.get_sigma_gaussian(1.0, 1e-5)
    std = sketch.sketch_noise_std(len(x), epsilon=1.0, delta=1e-5)
    assert std == pytest.approx(z * 2 / len(x), rel=1e-9)
    rng = np.random.default_rng(11)
    noise = np.array(
        [
            sketch.release_sketch(made, epsilon=1.0, delta=1e-5, rng=rng).mean - made.mean
            for _ in range(600)
        ]
    )
    dof = noise.size - 1
    low, high = stats.chi2.ppf([0.0005, 0.9995], dof) / dof
    assert low <= noise.var(ddof=1) / std**2 <= high
    assert abs(noise.mean()) < 4 * std / math.sqrt(noise.size)


def test_the_secure_sum_carries_one_central_release_of_noise():
    z = dp_accounting.get_sigma_gaussian(1.0, 1e-5)
    std = sketch.sketch_sum_std(2000, epsilon=1.0, delta=1e-5, threshold=3, n_sites=4)
    assert std == pytest.approx(2 * z * math.sqrt(4 / 3) / 2000, rel=1e-9)
    with pytest.raises(ValueError, match="a sum needs 3 sites, got 2"):
        sketch.sketch_sum_std(2000, epsilon=1.0, delta=1e-5, threshold=3, n_sites=2)


def test_pooled_sketch_is_the_sketch_of_the_pooled_rows(samples):
    x, _ = samples
    fmap = sketch.FeatureMap(5, 64, H, seed=4)
    parts = [fmap.sketch(x[:30]), fmap.sketch(x[30:])]
    assert np.allclose(sketch.pool(parts).mean, fmap.sketch(x).mean, atol=1e-15)
    assert sketch.pool(parts).n == len(x)


def test_files_round_trip_and_mismatches_are_refused_by_name(tmp_path, samples):
    x, _ = samples
    made = sketch.FeatureMap(5, 64, H, seed=4).sketch(x)
    sketch.save(tmp_path / "a.sketch.npz", made)
    back = sketch.load(tmp_path / "a.sketch.npz")
    assert np.array_equal(back.mean, made.mean) and back.n == made.n and back.meta == made.meta
    other = sketch.FeatureMap(5, 64, 2.0, seed=4).sketch(x)
    with pytest.raises(ValueError, match="field 'bandwidth' differs"):
        sketch.check_compatible([made.meta, other.meta])
    with pytest.raises(ValueError, match="field 'extractor' differs"):
        sketch.pool([made, sketch.Sketch(made.mean, 3, made.meta | {"extractor": "inception"})])
    np.save(tmp_path / "pickled.npy", np.array([{"a": 1}], dtype=object))
    (tmp_path / "pickled.npy").rename(tmp_path / "bad.sketch.npz")
    with pytest.raises(ValueError, match="bad.sketch.npz: not a sketch file"):
        sketch.load(tmp_path / "bad.sketch.npz")
