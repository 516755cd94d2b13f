"""Kendall's tau-b of the summaries (``table.tau_b``) against scipy.stats.kendalltau."""

import numpy as np
import pytest
from scipy import stats

from distrank.metrics.table import tau_b

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("n", [2, 3, 5, 12])
@pytest.mark.parametrize("levels", [2, 4, None])
def test_tau_b_is_scipys_with_and_without_ties(n, levels):
    for _ in range(20):
        a, b = RNG.normal(size=n), RNG.normal(size=n)
        if levels is not None:  # ties in both columns
            a, b = np.round(a * levels / 4), np.round(b * levels / 4)
        expected = stats.kendalltau(b, a).statistic
        if np.isnan(expected):
            assert np.isnan(tau_b(a, b))
        else:
            assert tau_b(a, b) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize(
    "a,b", [([1.0], [2.0]), ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]), ([1.0, np.nan], [1.0, 2.0])]
)
def test_tau_b_is_nan_where_undefined(a, b):
    assert np.isnan(tau_b(a, b))
