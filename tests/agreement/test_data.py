"""The study's distributions: Friedman #1 has Bayes MSE 1 (its regression function
written out independently), the finite sets are uniform over their rows."""

import numpy as np
import pytest

from distrank.agreement.data import diabetes, digits_binary, digits_onehot, friedman1, population


def friedman_mean(X):
    return (
        10 * np.sin(np.pi * X[:, 0] * X[:, 1])
        + 20 * (X[:, 2] - 0.5) ** 2
        + 10 * X[:, 3]
        + 5 * X[:, 4]
    )


def test_friedman1_noise_is_unit_variance():
    pop = friedman1(n_eval=200_000, seed=0)
    resid = pop.y - friedman_mean(pop.X)
    assert pop.bayes_mse == 1.0
    assert abs(resid.mean()) < 4 / np.sqrt(len(resid))
    assert np.mean(resid**2) == pytest.approx(1.0, abs=4 * np.sqrt(2 / len(resid)))


def test_training_samples_are_fresh_and_seeded():
    pop = friedman1(n_eval=10, seed=0)
    a = pop.draw(50, np.random.default_rng(1))
    b = pop.draw(50, np.random.default_rng(1))
    c = pop.draw(50, np.random.default_rng(2))
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.allclose(a[0], c[0])


def test_finite_sets_are_uniform_over_rows():
    pop = diabetes()
    assert pop.X.shape == (442, 10)
    assert pop.y.mean() == pytest.approx(0.0, abs=1e-12) and pop.y.std() == pytest.approx(1.0)
    X, y = pop.draw(20_000, np.random.default_rng(0))
    rows = {tuple(r) for r in pop.X}
    assert all(tuple(r) in rows for r in X[:200])
    onehot, binary = digits_onehot(), digits_binary()
    assert onehot.y.shape == (1797, 10) and (onehot.y.sum(axis=1) == 1).all()
    assert set(np.unique(binary.y)) == {0.0, 1.0}
    assert onehot.X.max() == 1.0 and onehot.X.min() == 0.0


def test_unknown_population_is_named():
    with pytest.raises(ValueError, match=r"^data must be one of .*, got 'california'$"):
        population("california", n_eval=10, seed=0)
