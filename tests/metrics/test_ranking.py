"""The one Kendall tau-b (``ranking.tau_b``) against scipy.stats.kendalltau, to the last bit."""

import numpy as np
import pytest
from scipy import stats

from distrank.metrics._ranking import tau_b
from distrank.metrics._table import kendall_tau

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("n", [2, 3, 5, 12])
@pytest.mark.parametrize("levels", [2, 4, None])
def test_tau_b_is_scipys_bit_for_bit_with_and_without_ties(n, levels):
    x, y = RNG.normal(size=(2, 40, n))
    if levels is not None:  # ties in both
        x, y = np.round(x * levels / 4), np.round(y * levels / 4)
    expected = np.array([stats.kendalltau(a, b).statistic for a, b in zip(x, y)])
    batch = tau_b(x, y)  # 40 rankings at once
    assert np.array_equal(batch, expected, equal_nan=True)
    assert all(np.array_equal(tau_b(a, b), e, equal_nan=True) for a, b, e in zip(x, y, expected))


@pytest.mark.parametrize(
    "a,b", [([1.0], [2.0]), ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]), ([1.0, np.nan], [1.0, 2.0])]
)
def test_tau_b_is_nan_where_undefined(a, b):
    assert np.isnan(tau_b(a, b)) and np.isnan(kendall_tau(a, b)[0])


def test_kendall_tau_is_tau_b_of_avg_against_all_with_scipys_p_value():
    all_values, avg_values = RNG.normal(size=(2, 9))
    expected = stats.kendalltau(avg_values, all_values)
    assert kendall_tau(all_values, avg_values) == (expected.statistic, expected.pvalue)
