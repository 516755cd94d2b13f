"""distrank.metrics.fd._settings: FD extrapolated, FD on principal axes and the fitted
family's exact FD, each against E3's closed form (gaussian_fd) on Gaussians whose FD is
known; the between-class trace against its definition."""

import numpy as np
import pytest

from distrank.experiments.e3_gaussian_theory import (
    GaussianClients,
    e3_curves,
    e3_table,
    gaussian_fd,
    ring_clients,
    spd_power,
)
from distrank.metrics.fd._settings import FdSettings, between_classes
from distrank.zoo.feature_space import fitted_samples


def gaussian_truth(rng, d: int, k: int = 3, spread: float = 1.0) -> GaussianClients:
    """k client Gaussians of random covariances in d dimensions (E3's container)."""
    covs = []
    for _ in range(k):
        a = rng.standard_normal((d, d))
        covs.append(a @ a.T / (2 * d) + 0.1 * np.eye(d))
    return GaussianClients(spread * rng.standard_normal((k, d)), np.array(covs), np.ones(k))


def fd_sum(terms) -> float:
    mean, trace_reference, trace_model, root, _ = terms  # and the between-class part
    return mean + trace_reference + trace_model - 2 * root


def test_extrapolated_fd_removes_the_small_sample_bias():
    """Chong and Forsyth's FD at m -> infinity on Gaussians whose FD is known (E3's
    closed form): 150 rows per client and 150 samples in 16 dimensions bias FD_all and
    FD_avg upward by many standard errors over 30 independent datasets; the intercept
    of the line in 1/m is within 3 of them of the truth."""
    rng = np.random.default_rng(31)
    truth = gaussian_truth(rng, d=16)
    mean, cov = truth.pooled_mean, 0.7 * truth.pooled_covariance  # the model
    exact = {
        "all": gaussian_fd(truth.pooled_mean, truth.pooled_covariance, mean, cov),
        "avg": np.mean([gaussian_fd(m, c, mean, cov) for m, c in zip(truth.means, truth.covs)]),
    }
    estimates = {"features": [], "extrapolated": []}
    for r in range(30):
        clients = [rng.multivariate_normal(m, c, size=150) for m, c in zip(truth.means, truth.covs)]
        model = rng.multivariate_normal(mean, cov, size=150)
        extrapolation = {"fractions": [0.5, 0.75, 1.0], "draws": 5}
        terms = FdSettings(clients, extrapolation=extrapolation, seed=r).terms(model)
        for setting, values in estimates.items():
            values.append([fd_sum(terms[setting][agg]) for agg in ("all", "avg")])
    for agg, col in (("all", 0), ("avg", 1)):
        plain, extrapolated = (np.array(estimates[s])[:, col] for s in estimates)
        bias, error = plain.mean() - exact[agg], extrapolated.mean() - exact[agg]
        se = extrapolated.std(ddof=1) / np.sqrt(len(extrapolated))
        assert bias > 6 * plain.std(ddof=1) / np.sqrt(len(plain)), agg
        assert abs(error) < 3 * se and abs(error) < 0.2 * bias, (agg, bias, error, se)


def test_pca_fd_is_the_fd_of_the_projected_gaussians():
    """Clients and model vary in 3 of 10 coordinates beyond a 0.01 floor, but the model
    is also spread in the other 7: FD on the pool's first 3 principal axes is the closed
    form of the Gaussians projected on those coordinates (E3's gaussian_fd), not the full
    FD; the axes are numpy's leading eigenvectors of the pooled covariance."""
    rng = np.random.default_rng(7)
    low = gaussian_truth(rng, d=3, spread=3.0)
    means = np.hstack([low.means, np.zeros((3, 7))])
    floor = 0.01 * np.eye(7)
    covs = np.stack(
        [np.block([[c, np.zeros((3, 7))], [np.zeros((7, 3)), floor]]) for c in low.covs]
    )
    clients = [rng.multivariate_normal(m, c, size=4000) for m, c in zip(means, covs)]
    model_cov = np.block([[0.8 * np.eye(3), np.zeros((3, 7))], [np.zeros((7, 3)), np.eye(7)]])
    model = rng.multivariate_normal(np.zeros(10), model_cov, size=4000)
    fd = FdSettings(clients, pca_dims=[3])
    got = fd.terms(model)
    pool = np.concatenate(clients)
    _, vecs = np.linalg.eigh(np.cov(pool.T))
    top = vecs[:, -3:]
    np.testing.assert_allclose(
        fd.spaces["pca3"].basis @ fd.spaces["pca3"].basis.T, top @ top.T, atol=1e-12
    )
    exact_all = gaussian_fd(low.pooled_mean, low.pooled_covariance, np.zeros(3), 0.8 * np.eye(3))
    exact_avg = np.mean(
        [gaussian_fd(m, c, np.zeros(3), 0.8 * np.eye(3)) for m, c in zip(low.means, low.covs)]
    )
    assert fd_sum(got["pca3"]["all"]) == pytest.approx(exact_all, rel=0.05)
    assert fd_sum(got["pca3"]["avg"]) == pytest.approx(exact_avg, rel=0.05)
    assert fd_sum(got["features"]["all"]) > exact_all + 5  # the 7 spread coordinates


def test_fitted_family_is_theorem_2_on_the_clients_statistics():
    """E3's variance-limited clients (ring_clients in 4 dims), 3000 rows each. The
    fitted family's exact FD (FdSettings.theory) is E3's closed form on the clients'
    statistics; at s = 1 its Gaussian is the pool's, E3's FD_all minimiser (FD 0); no
    s beats E3's FD_avg minimiser, the barycenter; FD_avg is least at s < 1; and FD
    from 20,000 fitted samples per s has the same best knobs (to one grid step)."""
    rng = np.random.default_rng(11)
    ring = ring_clients(3, 4)
    clients = [rng.multivariate_normal(m, c, size=3000) for m, c in zip(ring.means, ring.covs)]
    truth = GaussianClients(
        np.stack([c.mean(0) for c in clients]), np.stack([np.cov(c.T) for c in clients]), [1, 1, 1]
    )
    within = truth.covs.mean(axis=0)
    between = truth.pooled_covariance - within
    scales = np.round(np.arange(0.1, 1.51, 0.05), 2)
    fd = FdSettings(clients)
    theory = fd.theory(scales).pivot(index="value", columns="aggregation", values="fd")
    mu = truth.pooled_mean
    expected_all = [
        gaussian_fd(mu, truth.pooled_covariance, mu, s * within + between) for s in scales
    ]
    expected_avg = [
        np.mean(
            [gaussian_fd(m, c, mu, s * within + between) for m, c in zip(truth.means, truth.covs)]
        )
        for s in scales
    ]
    np.testing.assert_allclose(theory["all"], expected_all, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(theory["avg"], expected_avg, rtol=1e-9)
    e3 = e3_table(e3_curves(truth, [0.0, 1.0], bandwidth=1.0)).set_index("curve")
    assert theory.loc[1.0, "all"] == pytest.approx(
        e3.loc["FD_all", "value_at_pooled_cov"], abs=1e-9
    )
    assert theory["avg"].min() >= e3.loc["FD_avg", "value_at_barycenter"] - 1e-9
    best_avg = theory["avg"].idxmin()
    assert theory["all"].idxmin() == 1.0 and best_avg < 0.9
    draws = fitted_samples(clients, list(scales), n_samples=20000, seed=3)
    sampled = fd.table((s, *draws[s]) for s in scales)
    sampled = sampled.pivot(index="model", columns="aggregation", values="fd")
    assert abs(sampled["all"].idxmin() - 1.0) <= 0.05 + 1e-9
    assert abs(sampled["avg"].idxmin() - best_avg) <= 0.05 + 1e-9


def test_pure_covariance_scaling_has_the_issues_closed_form_argmins():
    """Clients with one mean (no between-client spread): the fitted family is C_Y = s W
    with W = mean_i C_i, so s*_all = (f(C_bar)/tr W)^2 = 1 and s*_avg = (mean_i f(C_i) /
    tr W)^2 with f(C) = tr (W^1/2 C W^1/2)^1/2; FD_avg is least there (a finer grid)."""
    rng = np.random.default_rng(5)
    truth = gaussian_truth(rng, d=5, spread=0.0)
    clients = [rng.multivariate_normal(np.zeros(5), c, size=500) for c in truth.covs]
    clients = [c - c.mean(axis=0) for c in clients]  # one mean: B = 0 exactly
    covs = [np.cov(c.T) for c in clients]
    within = np.mean(covs, axis=0)
    root = spd_power(within, 0.5)
    f = [np.sqrt(np.clip(np.linalg.eigvalsh(root @ c @ root), 0, None)).sum() for c in covs]
    s_avg = (np.mean(f) / np.trace(within)) ** 2
    grid = [s_avg - 1e-3, s_avg, s_avg + 1e-3, 0.999, 1.0, 1.001]
    theory = (
        FdSettings(clients).theory(grid).pivot(index="value", columns="aggregation", values="fd")
    )
    avg, all_ = theory["avg"].to_numpy(), theory["all"].to_numpy()
    assert avg[1] < avg[0] and avg[1] < avg[2] and all_[4] < all_[3] and all_[4] < all_[5]
    assert s_avg < 1.0


def test_between_classes_and_within_add_up_to_the_trace():
    rng = np.random.default_rng(8)
    labels = rng.integers(0, 4, 90)
    x = rng.standard_normal((90, 5)) + 3 * rng.standard_normal((4, 5))[labels]
    within = sum(((x[labels == c] - x[labels == c].mean(0)) ** 2).sum() for c in range(4)) / 89
    assert between_classes(x, labels) + within == pytest.approx(np.trace(np.cov(x.T)), rel=1e-12)
    assert between_classes(x, np.zeros(90)) == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(between_classes(x, None))
