"""A3 (networks), A4 (trees), A6 (general losses): the pair runner's plug-in terms
come from the same runs' 2p-models, the midpoint identity holds on every pair, the
strongly convex form bounds D on every pair, and an overfitting setting is flagged."""

import numpy as np
import pandas as pd
import pytest
from scipy import special
from sklearn.tree import DecisionTreeRegressor

from distrank.agreement.core import lemma_summary, logistic_mu
from distrank.agreement.data import digits_binary, digits_onehot, friedman1
from distrank.agreement.general_losses import (
    fit_logit_tree,
    general_losses_summary,
    logistic_pairs,
    multi_output_pairs,
)
from distrank.agreement.networks import fit_network, networks_pairs
from distrank.agreement.trees import trees_pairs


@pytest.fixture(scope="module")
def tree_pairs():
    return trees_pairs(friedman1(n_eval=4000, seed=1), [1, 2, 8], n_train=1000, n_pairs=8, seed=0)


def test_tree_pairs_identity_and_plug_in_terms(tree_pairs):
    p = tree_pairs
    assert (p["identity_residual"].abs() <= 1e-12 * np.maximum(1.0, p["D"])).all()
    np.testing.assert_array_equal(p["R_2p"], np.minimum(p["mse_g1"], p["mse_g2"]))
    np.testing.assert_allclose(
        p["bound"], 4 * (np.maximum(p["mse_f1"], p["mse_f2"]) - p["R_2p"]), rtol=1e-12
    )
    # the depth-2 models of the depth-1 rows are the depth-2 rows' models
    d1, d2 = (p[p["resource"] == r].set_index("pair") for r in (1, 2))
    np.testing.assert_array_equal(d1["mse_g1"], d2["mse_f1"])


def test_deep_trees_on_a_small_sample_are_flagged(tree_pairs):
    # depth 16 overfits 1,000 points: the plug-in bound at depth 8 goes negative
    s = lemma_summary(tree_pairs).set_index("resource")
    assert s.loc[8, "failure"] and s.loc[8, "bound_negative"]
    assert not s.loc[1, "failure"]


def test_network_runs_and_restarts_keep_the_best_training_fit():
    pop = friedman1(n_eval=500, seed=2)
    X, y = pop.draw(300, np.random.default_rng(0))
    one = fit_network(X, y, 4, 0, X, restarts=1, max_iter=200)
    three = fit_network(X, y, 4, 0, X, restarts=3, max_iter=200)
    assert np.mean((three - y) ** 2) <= np.mean((one - y) ** 2)
    pairs = networks_pairs(pop, [1, 2], n_train=300, n_pairs=2, seed=0, restarts=1, max_iter=200)
    assert (pairs["identity_residual"].abs() <= 1e-12 * np.maximum(1.0, pairs["D"])).all()


def test_logit_tree_leaves_are_clipped_leaf_log_odds():
    pop = digits_binary()
    X, y = pop.draw(600, np.random.default_rng(3))
    f = fit_logit_tree(X, y, 3, 0, X, logit_bound=2.0)
    leaves = DecisionTreeRegressor(max_depth=3, random_state=0).fit(X, y).apply(X)
    for leaf in np.unique(leaves):
        p = y[leaves == leaf].mean()
        assert f[leaves == leaf][0] == pytest.approx(
            np.clip(special.logit(np.clip(p, 1e-12, 1 - 1e-12)), -2, 2)
        )
    assert np.abs(f).max() <= 2.0 + 1e-12


@pytest.fixture(scope="module")
def general_pairs():
    return pd.concat(
        [
            multi_output_pairs(digits_onehot(), [1, 4], n_train=800, n_pairs=4, seed=0),
            logistic_pairs(
                digits_binary(), [1, 4], n_train=800, n_pairs=4, seed=1, logit_bound=3.0
            ),
        ],
        ignore_index=True,
    )


def test_multi_output_identity_and_strongly_convex_bound(general_pairs):
    sq = general_pairs[general_pairs["loss"] == "squared"]
    assert (sq["identity_residual"].abs() <= 1e-12 * np.maximum(1.0, sq["D"])).all()
    lg = general_pairs[general_pairs["loss"] == "logistic"]
    assert (lg["mu"] == logistic_mu(3.0)).all()
    assert (lg["D"] <= lg["midpoint_bound"]).all()
    s = general_losses_summary(general_pairs)
    assert (s["pairs_above_midpoint"] == 0).all()


def test_pair_tables_share_one_vocabulary(tree_pairs, general_pairs):
    """The spec's MSE names for squared loss (A1-A4); a table over losses (A6) says risk_."""
    models = {"f1", "f2", "fbar", "g1", "g2"}
    assert {c for c in tree_pairs.columns if c.startswith(("mse_", "risk_"))} == {
        f"mse_{m}" for m in models
    }
    assert {c for c in general_pairs.columns if c.startswith(("mse_", "risk_"))} == {
        f"risk_{m}" for m in models
    }
    assert not general_pairs.filter(like="risk_").isna().any().any()
