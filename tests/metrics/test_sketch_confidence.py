"""The confidence of a private sketch ranking: bias, gap noise, pair and order
probabilities and the plan, against Monte Carlo draws and scipy's closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from distrank.metrics._privacy import noise_multiplier
from distrank.metrics.sketch import _confidence as conf
from distrank.metrics.sketch._maps import FeatureMap, Sketch, sketch_kd

D = 256


@pytest.fixture(scope="module")
def sketched():
    """A reference sketch of 300 rows and three models' sketches (public map)."""
    rng = np.random.default_rng(11)
    fmap = FeatureMap(5, D, 2.0, 3)
    reference = fmap.sketch(rng.normal(size=(300, 5)))
    models = {
        name: fmap.sketch(rng.normal(shift, 1.0, size=(200, 5)))
        for name, shift in (("a", 0.05), ("b", 0.1), ("c", 0.6))
    }
    return reference, models


def noisy_values(reference, models, sigma, draws, rng):
    """(draws, models) KD values from the reference sketch with N(0, sigma^2 I) added."""
    out = np.empty((draws, len(models)))
    for i in range(draws):
        noisy = Sketch(reference.mean + rng.normal(0, sigma, D), reference.n, reference.meta)
        out[i] = [sketch_kd(noisy, t) for t in models.values()]
    return out


def test_the_bias_and_the_gap_noise_match_their_closed_forms(sketched):
    reference, models = sketched
    sigma, draws = 0.004, 4000
    values = noisy_values(reference, models, sigma, draws, np.random.default_rng(5))
    exact = np.array([sketch_kd(reference, t) for t in models.values()])
    bias = conf.bias(reference.n, D, sigma)
    assert bias == pytest.approx(300 / 299 * D * sigma**2)
    # E KD = exact + bias (every model alike), within 4 standard errors
    se = values.std(axis=0, ddof=1) / math.sqrt(draws)
    assert np.all(np.abs(values.mean(axis=0) - exact - bias) < 4 * se)
    unbiased = conf.unbiased(values, reference.n, D, sigma)
    assert np.all(np.abs(unbiased.mean(axis=0) - exact) < 4 * se)
    # the gap's variance is 4 sigma^2 |t_a - t_b|^2 (chi-square interval)
    t = {k: v.mean for k, v in models.items()}
    low, high = stats.chi2.ppf([0.0005, 0.9995], draws - 1) / (draws - 1)
    for a, b in (("a", "b"), ("a", "c")):
        ia, ib = list(models).index(a), list(models).index(b)
        ratio = (values[:, ia] - values[:, ib]).var(ddof=1) / conf.gap_std(sigma, t[a], t[b]) ** 2
        assert low <= ratio <= high


def test_pair_and_order_confidence_are_the_normal_probabilities():
    assert conf.pair_confidence(1.959963984540054, 1.0) == pytest.approx(0.975, abs=1e-12)
    assert conf.pair_confidence(-0.5, 0.0) == 1.0
    assert conf.z_of(0.95) == pytest.approx(stats.norm.ppf(0.95))
    with pytest.raises(ValueError, match="level: expected a number in"):
        conf.z_of(0.4)
    rng = np.random.default_rng(2)
    t = {m: rng.normal(size=6) for m in "xyz"}
    values = {"x": 0.10, "y": 0.13, "z": 0.21}
    sigma = 0.01
    # two adjacent gaps, jointly Gaussian: P(g - e > 0 for both) is a bivariate normal cdf
    d1, d2 = t["y"] - t["x"], t["z"] - t["y"]
    cov = 4 * sigma**2 * np.array([[d1 @ d1, d1 @ d2], [d1 @ d2, d2 @ d2]])
    exact = stats.multivariate_normal(mean=[0, 0], cov=cov).cdf([0.03, 0.08])
    got = conf.order_confidence(values, conf.sketch_loadings(t, sigma))
    assert got == pytest.approx(exact, abs=0.005)  # 100,000 draws: se <= 0.0016
    table = conf.confidence_table(values, conf.sketch_loadings(t, sigma), level=0.9)
    assert list(table.model) == ["x", "y"] and list(table.next) == ["y", "z"]
    std = 2 * sigma * np.linalg.norm(d1)
    assert table.noise_std[0] == pytest.approx(std)
    assert table.p_order[0] == pytest.approx(stats.norm.cdf(0.03 / std))
    assert table.resolved[0] == (0.03 >= stats.norm.ppf(0.9) * std)


def test_the_plan_resolves_its_target_at_the_epsilon_and_size_it_names(sketched):
    _, models = sketched
    t = {k: v.mean for k, v in models.items()}
    sizes = [200, 200, 5]
    table = conf.plan(t, sizes, epsilon=1.0, delta=1e-5, level=0.95, target_gap=0.002)
    z = noise_multiplier(epsilon=1.0, delta=1e-5)
    sigma = 2 * z * math.sqrt(3) / 405  # plain sketches: each site 2z / n_i on its mean
    assert conf.released_std(sizes, epsilon=1.0, delta=1e-5) == pytest.approx(sigma)
    for row in table.itertuples():
        std = 2 * sigma * np.linalg.norm(t[row.model] - t[row.other])
        assert row.gap_noise_std == pytest.approx(std)
        assert row.smallest_resolved_gap == pytest.approx(stats.norm.ppf(0.95) * std)
        # at the epsilon it names, the same sites resolve exactly the target gap
        again = conf.plan(
            {row.model: t[row.model], row.other: t[row.other]},
            sizes,
            epsilon=row.epsilon_for_target,
            delta=1e-5,
        )
        assert again.smallest_resolved_gap[0] == pytest.approx(0.002, rel=1e-6)
        # with the rows per site it names (3 equal sites), at epsilon 1: at most the target
        bigger = conf.plan(
            {row.model: t[row.model], row.other: t[row.other]},
            [row.rows_per_site_for_target] * 3,
            epsilon=1.0,
            delta=1e-5,
        )
        assert bigger.smallest_resolved_gap[0] <= 0.002 * (1 + 1e-9)
    assert table.gap_noise_std.is_monotonic_decreasing  # hardest pair first
    secure = conf.released_std(sizes, epsilon=1.0, delta=1e-5, secure=True, threshold=2)
    assert secure == pytest.approx(2 * z * math.sqrt(3 / 2) / 405)
