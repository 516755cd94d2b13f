"""A2: boosting. D falls with the rounds k (log-log slope < 0); with the exact
oracle (oracle error zero) D stays under 32 tau*^2 / k on every pair and falls at
least as fast as 1/k; tau* and the first round are checked in closed form."""

import numpy as np
import pytest

from distrank.agreement.boosting import (
    EXACT,
    atomic_norm,
    boosting_pairs,
    boosting_summary,
    equicorrelated_dictionary,
    exact_oracle_pairs,
    greedy_boost,
)
from distrank.agreement.core import loglog_slope
from distrank.agreement.data import friedman1

KS = [1, 2, 4, 8, 16, 32]


@pytest.fixture(scope="module")
def gbr_pairs():
    return boosting_pairs(
        friedman1(n_eval=3000, seed=3), KS, n_train=3000, max_depth=2, n_pairs=4, seed=0
    )


@pytest.fixture(scope="module")
def exact_pairs():
    return exact_oracle_pairs(
        [1, 2, 4, 8, 16, 32, 64, 128], p=32, rho=0.5, scale=3.0, n_pairs=30, seed=0
    )


def test_midpoint_identity_on_every_pair(gbr_pairs, exact_pairs):
    for pairs in (gbr_pairs, exact_pairs):
        assert (pairs["identity_residual"].abs() <= 1e-12 * np.maximum(1.0, pairs["D"])).all()


def test_gradient_boosting_disagreement_falls_with_rounds(gbr_pairs):
    mean_d = gbr_pairs.groupby("resource")["D"].mean()
    slope = loglog_slope(mean_d.index, mean_d.to_numpy())
    assert slope["slope_hi"] < 0, slope
    assert mean_d.iloc[-1] < 0.6 * mean_d.iloc[0]


def test_lemma_terms_come_from_the_2k_round_models(gbr_pairs):
    np.testing.assert_array_equal(
        gbr_pairs["R_2p"], np.minimum(gbr_pairs["mse_g1"], gbr_pairs["mse_g2"])
    )
    first = gbr_pairs[gbr_pairs["resource"] == 2].set_index("pair")["mse_f1"]
    np.testing.assert_array_equal(
        gbr_pairs[gbr_pairs["resource"] == 1].set_index("pair")["mse_g1"], first
    )


def test_atomic_norm_of_the_symmetric_target_is_its_scale():
    # by symmetry an optimal representation is (s/p) on every a_j, so tau* = s
    atoms, y = equicorrelated_dictionary(16, 0.3, 2.5)
    assert atomic_norm(atoms, y) == pytest.approx(2.5, rel=1e-9)
    np.testing.assert_allclose(np.mean(atoms * atoms, axis=0), 1.0)


def test_first_exact_round_in_closed_form():
    # f_1 = c a_i with c = <y, a_i> = (s/p)(1 + (p - 1) rho); two runs disagree by
    # 0 (same atom) or c^2 ||a_i - a_j||^2 = 2 c^2 (1 - rho)
    p, rho, s = 8, 0.4, 2.0
    atoms, y = equicorrelated_dictionary(p, rho, s)
    c = s / p * (1 + (p - 1) * rho)
    f = greedy_boost(atoms, y, 1, rng=np.random.default_rng(0))[0]
    assert np.mean(f * f) == pytest.approx(c**2)
    pairs = exact_oracle_pairs([1], p=p, rho=rho, scale=s, n_pairs=40, seed=1)
    distinct = ~np.isclose(pairs["D"], 0.0, atol=1e-14)
    np.testing.assert_allclose(pairs["D"][distinct], 2 * c**2 * (1 - rho), rtol=1e-12)
    assert 0 < (~distinct).sum() < 40


def test_exact_oracle_is_under_the_rate_bound_and_falls_like_1_over_k(exact_pairs):
    assert (exact_pairs["D"] <= exact_pairs["rate_bound"]).all()
    assert exact_pairs["tau"].iloc[0] == pytest.approx(3.0, rel=1e-9)
    mean_d = exact_pairs.groupby("resource")["D"].mean()
    assert loglog_slope(mean_d.index, mean_d.to_numpy())["slope"] <= -1.0
    assert (mean_d.index * mean_d).max() <= 32 * 3.0**2


def test_summary_reports_slopes_and_flags(gbr_pairs, exact_pairs):
    import pandas as pd

    s = boosting_summary(pd.concat([gbr_pairs, exact_pairs], ignore_index=True))
    exact = s[s["data"] == EXACT]
    assert exact["oracle_negligible"].all() and not exact["failure"].any()
    assert exact["slope_negligible"].iloc[0] == pytest.approx(exact["slope"].iloc[0])
    assert (s[s["data"] == "friedman1"]["slope"] < 0).all()
