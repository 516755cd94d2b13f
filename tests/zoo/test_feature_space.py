"""distrank.zoo.feature_space: the simulated and fitted families against their definitions
(the affine map of each class; each client's Gaussian, sample mean and covariance)."""

import numpy as np
import pytest

from distrank.zoo.feature_space import fitted_samples, pull_to_class_means


def test_pull_to_class_means_is_the_affine_map_of_each_class():
    rng = np.random.default_rng(0)
    x, labels = rng.standard_normal((50, 4)), rng.integers(0, 3, 50)
    pulled = pull_to_class_means(x, labels, 0.3)
    for c in range(3):
        mean = x[labels == c].mean(axis=0)
        np.testing.assert_allclose(pulled[labels == c].mean(axis=0), mean, atol=1e-14)
        np.testing.assert_allclose(
            pulled[labels == c] - mean, 0.3 * (x[labels == c] - mean), atol=1e-14
        )
    np.testing.assert_allclose(pull_to_class_means(x, labels, 1.0), x, atol=1e-14)
    with pytest.raises(ValueError, match=r"^tau: expected >= 0"):
        pull_to_class_means(x, labels, -1.0)


def test_fitted_samples_are_the_clients_gaussians_scaled():
    rng = np.random.default_rng(2)
    clients = [rng.standard_normal((7, 3)) * [1, 2, 3] + i for i in range(2)]
    draws = fitted_samples(clients, [0.25, 1.0], n_samples=20001, seed=4)
    x, labels = draws[1.0]
    np.testing.assert_array_equal(np.bincount(labels), [10001, 10000])  # shares of 7 and 7
    for i, rows in enumerate(clients):
        mine = x[labels == i].astype(np.float64)
        np.testing.assert_allclose(mine.mean(0), rows.mean(0), atol=0.05)
        np.testing.assert_allclose(np.cov(mine.T), np.cov(rows.T), atol=0.1 * np.cov(rows.T).max())
    # every scale shares the noise: x_s - mu = sqrt(s) (x_1 - mu)
    mu = np.where(labels[:, None] == 0, clients[0].mean(0), clients[1].mean(0))
    np.testing.assert_allclose(draws[0.25][0] - mu, 0.5 * (x - mu), atol=1e-5)
    with pytest.raises(ValueError, match="at least 2 rows"):
        fitted_samples([clients[0], clients[1][:1]], [1.0], n_samples=4, seed=0)
