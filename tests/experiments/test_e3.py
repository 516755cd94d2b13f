"""E3 (Theorem 2, closed form): FD_all prefers the pooled covariance, FD_avg the
W2 barycenter; KD_avg - KD_all is constant, so both KD curves share their argmin."""

import numpy as np
import pytest
import scipy.integrate
import scipy.linalg

from distrank.experiments.e3_gaussian_theory import (
    GaussianClients,
    barycenter_covariance,
    covariance_path,
    e3_curves,
    e3_figure,
    e3_table,
    gaussian_fd,
    gaussian_kernel_mean,
    mixture_kd,
    ring_clients,
)
from distrank.figures import save

T_GRID = np.round(np.linspace(-0.5, 1.5, 81), 12)  # step 0.025, holds 0 and 1 exactly


@pytest.fixture(scope="module")
def clients():
    return ring_clients(3, 2, radius=3.0, within_std=0.5, aspect=4.0, weights=[0.5, 0.3, 0.2])


@pytest.fixture(scope="module")
def curves(clients):
    return e3_curves(clients, T_GRID, bandwidth=1.0)


def test_kernel_mean_matches_quadrature_in_1d():
    a, va, b, vb, s = 0.3, 0.8, -1.1, 0.5, 0.7

    def density(x, m, v):
        return np.exp(-((x - m) ** 2) / (2 * v)) / np.sqrt(2 * np.pi * v)

    value, _ = scipy.integrate.dblquad(
        lambda y, x: np.exp(-((x - y) ** 2) / (2 * s**2)) * density(x, a, va) * density(y, b, vb),
        -12,
        12,
        -12,
        12,
        epsabs=1e-12,
    )
    assert gaussian_kernel_mean(
        np.array([a]), np.array([[va]]), np.array([b]), np.array([[vb]]), s
    ) == pytest.approx(value, rel=1e-8)


def test_kernel_mean_matches_monte_carlo_in_2d():
    rng = np.random.default_rng(0)
    a, b = np.array([0.5, -0.2]), np.array([-0.4, 0.9])
    ca, cb = np.array([[0.6, 0.2], [0.2, 0.3]]), np.array([[0.4, -0.1], [-0.1, 0.8]])
    x = rng.multivariate_normal(a, ca, 400_000)
    y = rng.multivariate_normal(b, cb, 400_000)
    mc = np.exp(-((x - y) ** 2).sum(1) / (2 * 1.3**2))
    exact = gaussian_kernel_mean(a, ca, b, cb, 1.3)
    assert abs(mc.mean() - exact) < 5 * mc.std() / np.sqrt(len(mc))


def test_gaussian_fd_matches_scipy_sqrtm():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3, 3))
    c1, c2 = a @ a.T + 0.1 * np.eye(3), b @ b.T + 0.1 * np.eye(3)
    m1, m2 = rng.standard_normal((2, 3))
    expected = (m1 - m2) @ (m1 - m2) + np.trace(c1 + c2 - 2 * scipy.linalg.sqrtm(c1 @ c2).real)
    assert gaussian_fd(m1, c1, m2, c2) == pytest.approx(expected, rel=1e-10)


def test_pooled_covariance_is_the_mixture_covariance(clients):
    lam, mu, cov = clients.weights, clients.means, clients.covs
    second_moment = sum(w * (c + np.outer(m, m)) for w, m, c in zip(lam, mu, cov))
    mean = lam @ mu
    np.testing.assert_allclose(
        clients.pooled_covariance, second_moment - np.outer(mean, mean), atol=1e-12
    )


def test_barycenter_commuting_closed_form_and_fixed_point(clients):
    diag = np.array([np.diag([1.0, 4.0]), np.diag([9.0, 1.0]), np.diag([0.25, 2.0])])
    lam = np.array([0.2, 0.5, 0.3])
    expected = np.diag((lam @ np.sqrt(np.array([np.diag(c) for c in diag]))) ** 2)
    np.testing.assert_allclose(barycenter_covariance(diag, lam), expected, rtol=1e-10)
    s = barycenter_covariance(clients.covs, clients.weights)
    root = scipy.linalg.sqrtm(s).real
    fixed = sum(
        w * scipy.linalg.sqrtm(root @ c @ root).real for w, c in zip(clients.weights, clients.covs)
    )
    np.testing.assert_allclose(fixed, s, atol=1e-10)


def test_barycenter_minimises_fd_avg_over_nearby_covariances(clients):
    rng = np.random.default_rng(2)
    s = barycenter_covariance(clients.covs, clients.weights)
    mu = clients.pooled_mean

    def fd_avg(cov):
        return sum(
            w * gaussian_fd(m, c, mu, cov)
            for w, m, c in zip(clients.weights, clients.means, clients.covs)
        )

    best = fd_avg(s)
    for _ in range(20):
        e = rng.standard_normal((2, 2)) * 0.05
        assert fd_avg(s + e @ e.T) > best and fd_avg(s - 0.5 * e @ e.T) > best


def test_path_endpoints(clients):
    s = barycenter_covariance(clients.covs, clients.weights)
    np.testing.assert_allclose(covariance_path(s, clients.pooled_covariance, 0.0), s, atol=1e-12)
    np.testing.assert_allclose(
        covariance_path(s, clients.pooled_covariance, 1.0), clients.pooled_covariance, atol=1e-12
    )


def test_fd_argmins_differ(curves):
    table = e3_table(curves).set_index("curve")
    assert table.loc["FD_all", "argmin_t"] == 1.0 and abs(table.loc["FD_all", "min_value"]) < 1e-12
    assert table.loc["FD_avg", "argmin_t"] == 0.0
    # Monotone on each side of the minimiser (FD is convex in the covariance).
    for name, t_star in (("FD_all", 1.0), ("FD_avg", 0.0)):
        slope = np.diff(curves[name].to_numpy())
        mid = (T_GRID[1:] + T_GRID[:-1]) / 2
        assert np.all(slope[mid < t_star] < 0) and np.all(slope[mid > t_star] > 0)


def test_kd_offset_is_constant_and_argmins_agree(clients, curves):
    offset = (curves["KD_avg"] - curves["KD_all"]).to_numpy()
    assert np.ptp(offset) < 1e-12
    # The offset is sum_i l_i KD(P_bar, P_i) (Theorem 1).
    lam, mu, cov = clients.weights, clients.means, clients.covs
    expected = sum(
        w * mixture_kd(lam, mu, cov, [1.0], m[None], c[None], 1.0) for w, m, c in zip(lam, mu, cov)
    )
    assert offset[0] == pytest.approx(expected, rel=1e-10)
    table = e3_table(curves).set_index("curve")
    assert table.loc["KD_all", "argmin_t"] == table.loc["KD_avg", "argmin_t"]


def test_rejects_bad_setup():
    with pytest.raises(ValueError, match="positive definite"):
        GaussianClients(np.zeros((2, 2)), np.array([np.eye(2), -np.eye(2)]), np.ones(2))
    with pytest.raises(ValueError, match=r"^bandwidth must be positive"):
        e3_curves(ring_clients(), [0.0, 1.0], bandwidth=0.0)


def test_figure(curves, tmp_path):
    fig = e3_figure(curves)
    assert [ax.get_ylabel().split(",")[0] for ax in fig.axes] == ["FD", "KD"]
    assert set(save(fig, tmp_path / "E3_gaussian_theory")) == {"pdf", "png"}
