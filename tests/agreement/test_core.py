"""The midpoint identity, the learning-curve bound's plug-in terms, intervals, the
summary's failure flags and the log-log slope, against values computed by hand or
by scipy on the same inputs."""

import numpy as np
import pandas as pd
import pytest
from scipy import special, stats

from distrank.agreement.core import (
    check_resources,
    child_seed,
    lemma_bound,
    logistic_mu,
    loglog_slope,
    loss_terms,
    mean_ci,
    midpoint_terms,
    pair_rngs,
    summarize,
)


@pytest.mark.parametrize("shape", [(500,), (300, 10)])
def test_midpoint_identity_holds_to_rounding(shape):
    rng = np.random.default_rng(1)
    y, f1, f2 = (rng.normal(scale=3.0, size=shape) for _ in range(3))
    t = midpoint_terms(y, f1, f2)
    d = np.mean(np.sum(((f1 - f2).reshape(shape[0], -1)) ** 2, axis=1))
    assert t["D"] == pytest.approx(d, rel=1e-14)
    assert abs(t["identity_residual"]) <= 1e-12 * max(1.0, t["D"])
    assert t["D"] == pytest.approx(2 * (t["mse_f1"] + t["mse_f2"] - 2 * t["mse_fbar"]), rel=1e-12)


def test_logistic_midpoint_bound_is_an_upper_bound_on_bounded_logits():
    rng = np.random.default_rng(2)
    b = 3.0
    y = rng.integers(0, 2, size=2000).astype(float)
    f1, f2 = rng.uniform(-b, b, size=2000), rng.uniform(-b, b, size=2000)
    t = loss_terms(y, f1, f2, loss="logistic", mu=logistic_mu(b))
    assert t["risk_f1"] == pytest.approx(
        np.mean(-y * np.log(special.expit(f1)) - (1 - y) * np.log(special.expit(-f1)))
    )
    assert t["D"] <= t["midpoint_bound"]
    # with mu eight times too large the inequality is not guaranteed, and fails here
    assert t["D"] > loss_terms(y, f1, f2, loss="logistic", mu=8 * logistic_mu(b))["midpoint_bound"]


def test_logistic_mu_is_the_smallest_curvature_on_the_interval():
    grid = np.linspace(-2.5, 2.5, 100_001)
    assert logistic_mu(2.5) == pytest.approx(
        np.min(special.expit(grid) * special.expit(-grid)), rel=1e-12
    )


def test_lemma_bound_terms_by_hand():
    t = lemma_bound(3.0, 3.5, 2.0, 2.4)
    assert (t["R_p"], t["eps"], t["R_2p"]) == (3.0, 0.5, 2.0)
    assert t["bound"] == pytest.approx(4 * (3.0 - 2.0 + 0.5))
    assert t["bound_anchor"] == pytest.approx(2 * (3.0 - 2.0) + 2 * (3.5 - 2.0))
    assert lemma_bound(3.0, 3.5, 2.0, 2.4, mu=0.5)["bound"] == pytest.approx(16 * 1.5)


def test_mean_ci_matches_scipy_t_interval():
    v = np.random.default_rng(3).exponential(size=31)
    mean, lo, hi = mean_ci(v, 0.95)
    ref = stats.t.interval(0.95, len(v) - 1, loc=v.mean(), scale=stats.sem(v))
    assert mean == pytest.approx(v.mean())
    assert (lo, hi) == pytest.approx(ref, rel=1e-12)


def test_summarize_flags_negative_and_below_d_bounds():
    pairs = pd.DataFrame(
        {
            "data": "x",
            "resource": [1, 1, 2, 2, 4, 4],
            "D": [1.0, 1.2, 1.0, 1.0, 1.0, 1.0],
            "bound": [2.0, 2.0, 0.5, 1.1, -0.5, -0.1],
        }
    )
    s = summarize(pairs).set_index("resource")
    assert s.loc[1, "failure"] == False  # noqa: E712
    assert (s.loc[2, "bound_below_D"], s.loc[2, "bound_negative"], s.loc[2, "pairs_below_D"]) == (
        True,
        False,
        1,
    )
    assert (s.loc[4, "bound_negative"], s.loc[4, "failure"], s.loc[4, "pairs_below_D"]) == (
        True,
        True,
        2,
    )
    assert s.loc[1, "D_mean"] == pytest.approx(1.1)


def test_loglog_slope_of_a_power_law():
    k = np.array([1, 2, 4, 8, 16])
    s = loglog_slope(k, 3.0 / k)
    assert s["slope"] == pytest.approx(-1.0, abs=1e-12)
    with pytest.raises(ValueError):
        loglog_slope(k, -1.0 / k)


def test_pair_rngs_are_reproducible_and_independent():
    a = [(p, r1.integers(1 << 30), r2.integers(1 << 30)) for p, r1, r2 in pair_rngs([0, 1], 3)]
    b = [
        (p, r1.integers(1 << 30), r2.integers(1 << 30))
        for p, r1, r2 in pair_rngs(child_seed(0, 1), 3)
    ]
    assert a == b
    assert len({x for _, *xs in a for x in xs}) == 6


@pytest.mark.parametrize("bad", [[], [0, 1], [1, 1], [1.5], [True]])
def test_check_resources_names_the_argument(bad):
    with pytest.raises(ValueError, match=r"^depths (must be|has) "):
        check_resources(bad, "depths")
