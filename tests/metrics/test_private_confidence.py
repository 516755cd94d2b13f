"""The confidence of ``score --private``'s ranking: the noise std of every model's avg,
derived from the release's own calibration, against a seeded Monte Carlo of the release
itself (``release_kd``): the avg's variance, its independence across models, each
adjacent pair's flip rate and the whole order's probability, each within its binomial or
chi-square error, with enough draws that a wrong std (one model's noise only) is far out."""

import math

import numpy as np
import pytest
from scipy import stats

from distrank.clients import client_weights
from distrank.metrics._privacy import client_budget, noise_multiplier
from distrank.metrics.kd._privacy import avg_noise_std, release_kd
from distrank.metrics.sketch import _confidence as conf

SIZES = np.array([25, 30, 35])
NAMES = ["a", "b", "c", "d"]
DRAWS = 200_000
EPSILON, DELTA = 2.0, 1e-5


def test_the_avg_noise_std_is_the_weighted_sum_of_the_client_releases_stds():
    budget = client_budget(epsilon=EPSILON, delta=DELTA, n_releases=len(NAMES))
    z = math.sqrt(len(NAMES)) * noise_multiplier(epsilon=EPSILON, delta=DELTA)
    sigma = z * 4 / SIZES  # each client's release: z times the U-statistic's 4 / n_i
    for scheme in ("size", "uniform"):
        w = client_weights(SIZES, scheme)
        got = avg_noise_std(SIZES, w, budget=budget)
        assert got == pytest.approx(math.sqrt(np.sum(w**2 * sigma**2)), rel=1e-12)
    # under n_i / n every lambda_i sigma_i is 4 z / n: s = 4 z sqrt(k) / n
    size = avg_noise_std(SIZES, client_weights(SIZES, "size"), budget=budget)
    assert size == pytest.approx(4 * z * math.sqrt(3) / SIZES.sum(), rel=1e-12)


@pytest.mark.parametrize("scheme", ["size", "uniform"])
def test_the_release_flips_each_pair_and_the_order_as_the_confidence_says(scheme):
    k, budget = len(SIZES), client_budget(epsilon=EPSILON, delta=DELTA, n_releases=len(NAMES))
    w = client_weights(SIZES, scheme)
    s = avg_noise_std(SIZES, w, budget=budget)
    tau = math.sqrt(2) * s
    # noiseless avgs 0.5, 1 and 2 gap stds apart (flip probabilities 0.31, 0.16, 0.023),
    # from client values that differ but average to them
    base = 0.1 + np.cumsum([0.0, 0.5 * tau, 1.0 * tau, 2.0 * tau])
    spread = np.random.default_rng(3).normal(0, 0.05, (len(NAMES), k))
    local = base[:, None] + spread - (spread @ w)[:, None]
    noisy = release_kd(
        np.broadcast_to(local, (DRAWS, *local.shape)),
        SIZES,
        budget=budget,
        rng=np.random.default_rng(7),
    )
    avg = noisy @ w  # (draws, models): what the server forms, draw by draw
    np.testing.assert_allclose(local @ w, base, rtol=1e-12)

    # every avg has variance s^2 (chi-square interval) and the models' noises are independent
    low, high = stats.chi2.ppf([0.0005, 0.9995], DRAWS - 1) / (DRAWS - 1)
    ratios = avg.var(axis=0, ddof=1) / s**2
    assert np.all((low <= ratios) & (ratios <= high))
    corr = np.corrcoef(avg, rowvar=False)[np.triu_indices(len(NAMES), 1)]
    assert np.all(np.abs(corr) < 4 / math.sqrt(DRAWS))

    values = dict(zip(NAMES, base))
    loadings = conf.independent_loadings(dict.fromkeys(NAMES, s))
    table = conf.confidence_table(values, loadings, level=0.95)
    assert list(table.model) == NAMES[:-1] and list(table.next) == NAMES[1:]
    np.testing.assert_allclose(table.noise_std, tau, rtol=1e-12)
    for row in table.itertuples():
        ia, ib = NAMES.index(row.model), NAMES.index(row.next)
        flips = float(np.mean(avg[:, ib] < avg[:, ia]))
        p = 1 - row.p_order
        se = math.sqrt(p * (1 - p) / DRAWS)
        assert abs(flips - p) < 4 * se
        # the draws tell a wrong std apart: a gap std of s (one model's noise) is far out
        assert abs(flips - stats.norm.sf(row.gap / s)) > 10 * se
        assert row.resolved == (row.gap >= stats.norm.ppf(0.95) * tau)
    assert list(table.resolved) == [False, False, True]

    whole = conf.order_confidence(values, loadings)
    kept = float(np.mean(np.all(np.diff(avg, axis=1) > 0, axis=1)))
    se = math.sqrt(whole * (1 - whole) * (1 / DRAWS + 1 / conf.ORDER_DRAWS))
    assert abs(kept - whole) < 4 * se
