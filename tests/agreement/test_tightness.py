"""A5: the construction y = e_0, g_i = e_0 + sigma e_i attains the constant 4:
E[D] / (R_k - R_2k) = 4 - 2 sigma^2 / (k + sigma^2), computed by least squares."""

import numpy as np
import pytest

from distrank.agreement.tightness import (
    construction_terms,
    tightness_pairs,
    tightness_ratio,
    tightness_summary,
    tightness_terms,
)


@pytest.mark.parametrize("k", [1, 2, 3, 8, 40])
@pytest.mark.parametrize("sigma2", [0.01, 0.5, 1.0, 4.0, 50.0])
def test_ratio_of_the_construction_equals_the_closed_form(k, sigma2):
    terms = construction_terms(k, sigma2)
    assert terms["ratio"] == pytest.approx(4 - 2 * sigma2 / (k + sigma2), abs=1e-6)
    assert terms["R_k"] == pytest.approx(sigma2 / (k + sigma2), rel=1e-9)
    assert terms["R_2k"] == pytest.approx(sigma2 / (2 * k + sigma2), rel=1e-9)
    assert terms["D"] == pytest.approx(2 * k * sigma2 / (k + sigma2) ** 2, rel=1e-9)


def test_ratio_tends_to_four_and_stays_below():
    k = np.array([1, 10, 100, 10_000])
    r = tightness_ratio(k, 1.0)
    assert np.all(np.diff(r) > 0) and np.all(r < 4) and r[-1] == pytest.approx(4, abs=1e-3)
    t = tightness_terms(k, 1.0)
    np.testing.assert_allclose(t["D"] / (t["R_k"] - t["R_2k"]), r, rtol=1e-12)


def test_sampled_pairs_obey_the_bound_and_approach_the_limit():
    pairs = tightness_pairs([1, 2, 4], sigma2s=[1.0], m=50_000, n_pairs=4, seed=0)
    assert (pairs["slack"] >= -1e-10).all()
    s = tightness_summary(pairs)
    # with 50,000 base models repeats are rare: the measured ratio is the limit
    np.testing.assert_allclose(s["ratio"], s["ratio_limit"], atol=1e-6)
