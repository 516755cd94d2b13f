"""A1: least-squares stacking; the pointwise bound holds exactly on every pair when
the fits and the risks use one evaluation sample."""

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from distrank.agreement.data import diabetes, friedman1
from distrank.agreement.stacking import span_fit, stacking_pairs, stacking_summary


def test_span_fit_matches_scikit_learn_least_squares():
    rng = np.random.default_rng(0)
    basis, y = rng.normal(size=(400, 7)), rng.normal(size=400)
    ref = LinearRegression(fit_intercept=False).fit(basis, y).predict(basis)
    np.testing.assert_allclose(span_fit(basis, y), ref, rtol=1e-10, atol=1e-12)


def test_span_fit_accepts_repeated_columns():
    rng = np.random.default_rng(1)
    b = rng.normal(size=(50, 3))
    y = rng.normal(size=50)
    np.testing.assert_allclose(span_fit(np.hstack([b, b]), y), span_fit(b, y), atol=1e-12)


@pytest.fixture(scope="module")
def pairs():
    import pandas as pd

    return pd.concat(
        [
            stacking_pairs(
                friedman1(n_eval=2000, seed=5), [1, 2, 4, 8], n_pairs=6, n_base=100, depth=3, seed=0
            ),
            stacking_pairs(diabetes(), [1, 2, 4, 8], n_pairs=6, n_base=100, depth=3, seed=1),
        ],
        ignore_index=True,
    )


def test_pointwise_bound_holds_on_every_pair(pairs):
    scale = np.maximum(1.0, pairs["bound"].abs())
    assert (pairs["slack"] >= -1e-10 * scale).all(), pairs.loc[pairs["slack"].idxmin()]
    assert (pairs["R_union"] <= np.minimum(pairs["R_G"], pairs["R_G2"]) + 1e-10).all()


def test_midpoint_identity_on_every_pair(pairs):
    assert (pairs["identity_residual"].abs() <= 1e-12 * np.maximum(1.0, pairs["D"])).all()


def test_summary_bound_is_four_times_the_learning_curve_gap(pairs):
    s = stacking_summary(pairs)
    np.testing.assert_allclose(s["bound_mean"], 4 * (s["R_k"] - s["R_2k"]), rtol=1e-12)
    assert not s["failure"].any() and (s["pairs_below_D"] == 0).all()


def test_runs_are_reproducible():
    pop = friedman1(n_eval=300, seed=2)
    a = stacking_pairs(pop, [1, 2], n_pairs=2, n_base=50, depth=2, seed=[7, 1])
    b = stacking_pairs(pop, [1, 2], n_pairs=2, n_base=50, depth=2, seed=[7, 1])
    assert a.equals(b)


def test_pair_columns_are_the_specs_mse_names(pairs):
    assert {"mse_f1", "mse_f2", "mse_fbar"} <= set(pairs.columns)
    assert not [c for c in pairs.columns if c.startswith("risk_")]
