"""Private client KD: sensitivity from brute force, noise from the exact Balle-Wang
condition solved here, accounting from dp-accounting called directly."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import mechanism_calibration
from dp_accounting.pld import pld_privacy_accountant
from scipy import integrate, optimize
from scipy.stats import norm
from sklearn.metrics.pairwise import laplacian_kernel, rbf_kernel

from distrank.metrics import score
from distrank.metrics._privacy import client_budget, epsilon_spent, noise_multiplier
from distrank.metrics.kd import kernel_distance
from distrank.metrics.kd._privacy import (
    SUM_SENSITIVITY,
    distributed_noise,
    kd_sensitivity,
    private_scores,
    release_kd,
)

RNG = np.random.default_rng(20240613)


def gram(kernel, a, b, bandwidth):
    if kernel == "rbf":
        return rbf_kernel(a, b, gamma=1.0 / (2 * bandwidth**2))
    return laplacian_kernel(a, b, gamma=1.0 / bandwidth)


def dense_kd(kernel, x, y, estimator, bandwidth):
    """Squared MMD from full scikit-learn kernel matrices (Gretton et al. 2012)."""
    kxx, kyy, kxy = (gram(kernel, a, b, bandwidth) for a, b in ((x, x), (y, y), (x, y)))
    n, m = len(x), len(y)
    if estimator == "biased":
        return kxx.mean() + kyy.mean() - 2 * kxy.mean()
    return (
        (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
        + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
        - 2 * kxy.mean()
    )


def batched_kd(kernel, xs, y, estimator, bandwidth):
    """KD of each data set xs[b] (n rows) against y, from dense kernel matrices written
    out here (rbf: exp(-|.|_2^2 / 2h^2), laplace: exp(-|.|_1 / h)), batched over b."""

    def k(a, b):
        diff = a[..., :, None, :] - b[..., None, :, :]
        if kernel == "rbf":
            return np.exp(-(diff**2).sum(-1) / (2 * bandwidth**2))
        return np.exp(-np.abs(diff).sum(-1) / bandwidth)

    kxx, kyy, kxy = k(xs, xs), k(y, y), k(xs, y)
    n, m = xs.shape[-2], y.shape[0]
    if estimator == "biased":
        return kxx.mean((-2, -1)) + kyy.mean() - 2 * kxy.mean((-2, -1))
    return (
        (kxx.sum((-2, -1)) - np.trace(kxx, axis1=-2, axis2=-1)) / (n * (n - 1))
        + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
        - 2 * kxy.mean((-2, -1))
    )


def largest_replacement_change(kernel, x, y, candidates, estimator, bandwidth):
    """max over rows i and candidate rows c of |KD(X with x_i := c, Y) - KD(X, Y)|."""
    n = len(x)
    replaced = np.repeat(x[None], n * len(candidates), axis=0)
    rows = np.repeat(np.arange(n), len(candidates))
    replaced[np.arange(len(replaced)), rows] = np.tile(candidates, (n, 1))
    base = batched_kd(kernel, x, y, estimator, bandwidth)
    return float(np.abs(batched_kd(kernel, replaced, y, estimator, bandwidth) - base).max())


def test_sensitivity_closed_forms():
    assert kd_sensitivity(10, estimator="unbiased") == pytest.approx(0.4, rel=1e-15)
    assert kd_sensitivity(10, estimator="biased") == pytest.approx(2 * 19 / 100, rel=1e-15)
    assert kd_sensitivity(1, estimator="biased") == pytest.approx(2.0, rel=1e-15)
    with pytest.raises(ValueError, match=r"^n_rows: "):
        kd_sensitivity(1, estimator="unbiased")
    with pytest.raises(ValueError, match=r"^estimator: "):
        kd_sensitivity(10, estimator="subsets")


def test_dense_references_equal_kernel_distance():
    x, y = RNG.normal(size=(6, 2)), RNG.normal(size=(4, 2))
    for kernel in ("rbf", "laplace"):
        for est in ("unbiased", "biased"):
            got = kernel_distance(
                x,
                y,
                kernel=kernel,
                kernel_params={"bandwidth": 0.8},
                estimator=est,
                dtype="float64",
            )
            assert got == pytest.approx(dense_kd(kernel, x, y, est, 0.8), rel=1e-12, abs=1e-15)
            assert got == pytest.approx(batched_kd(kernel, x, y, est, 0.8), rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("kernel", ["rbf", "laplace"])
@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
@pytest.mark.parametrize("n,m", [(3, 2), (4, 3), (6, 5)])
def test_sensitivity_bounds_every_replacement_and_is_nearly_reached(kernel, estimator, n, m):
    """Random data on two far clusters (plus jitter; X mostly on one, Y mostly on the
    other) often come near the extremal configuration: the largest change over 300 data
    sets and all single-row replacements never exceeds the bound and comes within a
    factor 0.95 of it. Unstructured Gaussian data never exceed it either."""
    bound = kd_sensitivity(n, estimator=estimator)
    centres = np.array([[0.0, 0.0], [12.0, 0.0]])
    worst = 0.0
    for _ in range(300):
        x = centres[(RNG.random(n) < 0.15).astype(int)] + RNG.normal(scale=0.01, size=(n, 2))
        y = centres[(RNG.random(m) < 0.85).astype(int)] + RNG.normal(scale=0.01, size=(m, 2))
        candidates = np.vstack([centres, centres + [0, 12.0]])
        change = largest_replacement_change(kernel, x, y, candidates, estimator, 1.0)
        assert change <= bound * (1 + 1e-12)
        worst = max(worst, change)
    assert worst >= 0.95 * bound
    for _ in range(50):
        x, y = RNG.normal(size=(n, 3)), RNG.normal(0.5, 1.5, size=(m, 3))
        candidates = RNG.normal(scale=3.0, size=(4, 3))
        bandwidth = float(RNG.uniform(0.2, 3.0))
        assert largest_replacement_change(
            kernel, x, y, candidates, estimator, bandwidth
        ) <= bound * (1 + 1e-12)


def balle_wang_sigma(epsilon, delta, sensitivity):
    """sigma solving Phi(D/2s - e s/D) - e^e Phi(-D/2s - e s/D) = delta (Balle and Wang
    2018, Theorem 8), by Brent's method on a log scale, written here from the paper."""

    def excess(log_sigma):
        s = math.exp(log_sigma)
        a, b = sensitivity / (2 * s), epsilon * s / sensitivity
        return norm.cdf(a - b) - math.exp(epsilon) * norm.cdf(-a - b) - delta

    return math.exp(
        optimize.brentq(
            excess, math.log(sensitivity) - 10, math.log(sensitivity) + 10, xtol=1e-14, rtol=1e-14
        )
    )


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_a_sites_term_n_kd_moves_by_at_most_the_sum_sensitivity(estimator):
    """n_i KD_i, a site's term of the secure sum, moves by at most 4 when one of its rows is
    replaced: n kd_sensitivity(n) is 4 (U) and below it (V), checked on the largest
    replacement found on two far clusters."""
    for n in (2, 3, 10, 1000):
        product = n * kd_sensitivity(n, estimator=estimator)
        assert product <= SUM_SENSITIVITY and (estimator == "biased" or product == 4.0)
    centres = np.array([[0.0, 0.0], [12.0, 0.0]])
    x = centres[[0, 0, 0, 1]] + RNG.normal(scale=0.01, size=(4, 2))
    change = largest_replacement_change("rbf", x, centres[[1, 1, 1]], centres, estimator, 1.0)
    term = 4 * kd_sensitivity(4, estimator=estimator)  # n = 4: near-extremal data reach it
    assert 0.85 * term <= 4 * change <= term * (1 + 1e-12) and term <= SUM_SENSITIVITY


@pytest.mark.parametrize("models,threshold,sizes", [(1, 2, [50, 50]), (5, 3, [40, 70, 90, 200])])
def test_distributed_noise_is_one_gaussian_mechanism_split_over_the_sites(models, threshold, sizes):
    """sigma of the sum is Balle and Wang's calibration (written above) for the sum's
    L2 sensitivity over all models, 4 sqrt(M); a site adds sigma^2 / t; the released
    KD_avg's std is sqrt(k t / A) times less than when each site releases its own noisy
    KD (``release_kd``: the lambda-weighted stds z 4 / n_i lambda_i are all 4 z / n)."""
    epsilon, delta = 1.0, 1e-6
    noise = distributed_noise(epsilon=epsilon, delta=delta, n_models=models, threshold=threshold)
    sigma = balle_wang_sigma(epsilon, delta, SUM_SENSITIVITY * math.sqrt(models))
    assert noise.sum_std == pytest.approx(sigma, rel=1e-9)
    assert noise.site_std**2 * threshold == pytest.approx(sigma**2, rel=1e-12)
    n, k = sum(sizes), len(sizes)
    lam = np.array(sizes) / n
    stds = [noise.budget.noise_std(kd_sensitivity(m)) for m in sizes]  # per-site releases
    per_site = math.sqrt(float(np.sum((lam * stds) ** 2)))
    assert per_site == pytest.approx(sigma * math.sqrt(k) / n, rel=1e-12)
    for sites in range(threshold, k + 1):
        ratio = per_site / noise.released_std(n, sites)
        assert ratio == pytest.approx(math.sqrt(k * threshold / sites), rel=1e-12)
    with pytest.raises(ValueError, match="a sum needs"):
        noise.released_std(n, threshold - 1)


@pytest.mark.parametrize("epsilon", [0.1, 0.3, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_noise_std_of_one_release_is_the_analytic_gaussian_calibration(epsilon, delta):
    sensitivity = kd_sensitivity(250, estimator="unbiased")
    z = noise_multiplier(epsilon=epsilon, delta=delta, n_releases=1)
    expected = balle_wang_sigma(epsilon, delta, sensitivity)
    assert z * sensitivity == pytest.approx(expected, rel=1e-8)
    assert z == pytest.approx(dp_accounting.get_sigma_gaussian(epsilon, delta), rel=1e-12)


def mpmath_noise_multiplier(epsilon, delta):
    """z = sigma / Delta solving the Balle-Wang condition at 50 digits, by bisection."""
    mp = pytest.importorskip("mpmath").mp
    mp.dps = 50

    def excess(log_z):  # decreasing in z
        mu = 1 / mp.exp(log_z)
        eps = mp.mpf(epsilon)
        return mp.ncdf(mu / 2 - eps / mu) - mp.exp(eps) * mp.ncdf(-mu / 2 - eps / mu) - delta

    low, high = mp.mpf(-40), mp.mpf(40)
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if excess(mid) > 0 else (low, mid)
    return float(mp.exp((low + high) / 2))


@pytest.mark.parametrize("epsilon", [1e-3, 0.5, 1e3, 1e6, 1e9])
@pytest.mark.parametrize("n_releases", [1, 7])
def test_calibration_and_accounting_hold_across_the_epsilon_range(epsilon, n_releases):
    """Across [1e-3, 1e9] the noise equals a 50-digit solution of the Balle-Wang
    condition (M releases are one release of multiplier z / sqrt(M)) and the
    accounting gives the budget back."""
    delta = 1e-5
    z = noise_multiplier(epsilon=epsilon, delta=delta, n_releases=n_releases)
    exact = math.sqrt(n_releases) * mpmath_noise_multiplier(epsilon, delta)
    assert z == pytest.approx(exact, rel=1e-12)
    spent = epsilon_spent(noise_multiplier=z, n_releases=n_releases, delta=delta)
    assert spent == pytest.approx(epsilon, rel=1e-12)


@pytest.mark.parametrize("bad", [0, -1, 9e-4, 1.1e9, float("nan"), float("inf")])
def test_epsilon_outside_the_range_is_refused(bad):
    with pytest.raises(ValueError, match=r"^epsilon: expected"):
        client_budget(epsilon=bad, delta=1e-5, n_releases=2)


def test_two_releases_compose_to_the_budget_by_numerical_integration():
    """delta(eps) of two releases of shift D, std sigma, is the hockey-stick divergence
    of N((D, D), sigma^2 I) from N(0, sigma^2 I), integrated here on a 2-d grid (no GDP)."""
    epsilon, delta, sensitivity = 1.0, 1e-3, 0.5
    sigma = noise_multiplier(epsilon=epsilon, delta=delta, n_releases=2) * sensitivity
    grid = np.linspace(-10 * sigma, 10 * sigma + sensitivity, 1501)
    u, v = np.meshgrid(grid, grid, indexing="ij")
    p = norm.pdf(u, sensitivity, sigma) * norm.pdf(v, sensitivity, sigma)
    q = norm.pdf(u, 0, sigma) * norm.pdf(v, 0, sigma)
    got = integrate.trapezoid(
        integrate.trapezoid(np.maximum(p - math.exp(epsilon) * q, 0), grid), grid
    )
    assert got == pytest.approx(delta, rel=1e-3)


@pytest.mark.parametrize("n_releases", [1, 4, 12])
@pytest.mark.parametrize("epsilon", [0.3, 3.0])
def test_accounting_equals_dp_accounting_called_directly(n_releases, epsilon):
    delta = 1e-5
    z = noise_multiplier(epsilon=epsilon, delta=delta, n_releases=n_releases)
    spent = epsilon_spent(noise_multiplier=z, n_releases=n_releases, delta=delta)
    # the same composition, spelt out as n_releases separate events of shift 1, std z
    accountant = pld_privacy_accountant.PLDAccountant()
    for _ in range(n_releases):
        accountant.compose(dp_accounting.GaussianDpEvent(z))
    assert spent == pytest.approx(accountant.get_epsilon(delta), rel=1e-5)
    assert spent == pytest.approx(epsilon, rel=1e-8)
    # RDP, a valid but looser accountant
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), n_releases))
    assert spent < rdp.get_epsilon(delta) < 2 * spent


def test_split_equals_dp_accounting_calibration():
    """The budget split equals dp-accounting's own calibration of the composed releases."""
    epsilon, delta, n_releases = 1.0, 1e-5, 3
    z0 = noise_multiplier(epsilon=epsilon, delta=delta, n_releases=n_releases)
    z = mechanism_calibration.calibrate_dp_mechanism(
        pld_privacy_accountant.PLDAccountant,
        lambda z: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), n_releases),
        epsilon,
        delta,
        mechanism_calibration.ExplicitBracketInterval(z0 / 2, 2 * z0),
    )
    assert z0 == pytest.approx(z, rel=1e-8)
    budget = client_budget(epsilon=epsilon, delta=delta, n_releases=n_releases)
    assert budget.noise_multiplier == z0
    assert budget.epsilon_spent == pytest.approx(epsilon, rel=1e-8)


def test_release_adds_noise_of_each_clients_std():
    budget = client_budget(epsilon=1.0, delta=1e-5, n_releases=3)
    sizes = np.array([20, 80])
    kd = np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    noisy = release_kd(
        np.broadcast_to(kd, (20000, 3, 2)), sizes, budget=budget, rng=np.random.default_rng(5)
    )
    std = budget.noise_multiplier * 4.0 / sizes
    noise = (noisy - kd) / std
    assert np.abs(noise.mean(axis=0)).max() < 5 / math.sqrt(20000)
    assert np.abs(noise.std(axis=0) - 1).max() < 0.03
    assert abs(np.corrcoef(noise[:, 0, 0], noise[:, 1, 1])[0, 1]) < 0.03
    with pytest.raises(ValueError, match=r"^budget: split over 3 releases"):
        release_kd(kd[:2], sizes, budget=budget, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"^client_sizes: expected 2 sizes"):
        release_kd(kd, sizes[:1], budget=budget, rng=np.random.default_rng(0))


def test_private_scores_average_the_noisy_client_values():
    x = RNG.normal(size=(90, 3))
    clients = np.repeat(["a", "b", "c"], [20, 30, 40])
    models = {"g": RNG.normal(size=(25, 3)), "h": RNG.normal(0.4, 1.0, size=(25, 3))}
    params = {"bandwidth": 1.2}
    table, budget = private_scores(
        x, clients, models, epsilon=2.0, delta=1e-4, kernel_params=params, seed=3, dtype="float64"
    )
    exact = score(
        x, clients, models, metrics=("kd",), kernel="rbf", kernel_params=params, dtype="float64"
    )
    assert set(table.aggregation) == {"avg", "client"}
    assert budget.n_releases == 2 and budget.epsilon == 2.0
    for model in models:
        mine = table[table.model == model]
        local = mine[mine.aggregation == "client"].sort_values("client")
        avg = mine[mine.aggregation == "avg"].value.item()
        assert avg == pytest.approx(local.value @ np.array([20, 30, 40]) / 90, rel=1e-12)
        truth = exact[(exact.model == model) & (exact.aggregation == "client")]
        shift = local.value.to_numpy() - truth.sort_values("client").value.to_numpy()
        assert np.all(np.abs(shift) < 6 * budget.noise_multiplier * 4 / np.array([20, 30, 40]))
        assert np.all(shift != 0)
    again, _ = private_scores(
        x, clients, models, epsilon=2.0, delta=1e-4, kernel_params=params, seed=3, dtype="float64"
    )
    assert again.equals(table)


def test_private_scores_check_their_arguments():
    x, clients, models = (
        RNG.normal(size=(20, 2)),
        np.repeat([0, 1], 10),
        {"g": RNG.normal(size=(10, 2))},
    )
    with pytest.raises(ValueError, match=r"^kernel: private KD needs a kernel bounded"):
        private_scores(x, clients, models, epsilon=1, delta=1e-5, kernel="poly")
    with pytest.raises(
        ValueError, match=r"^kernel_params: private KD needs an explicit 'bandwidth'"
    ):
        private_scores(x, clients, models, epsilon=1, delta=1e-5, kernel="rbf")
    with pytest.raises(
        ValueError,
        match=r"^kd_estimator: expected .unbiased. or .biased. \(private KD is a full-sample",
    ):
        private_scores(
            x,
            clients,
            models,
            epsilon=1,
            delta=1e-5,
            kernel_params={"bandwidth": 1.0},
            kd_estimator="subsets",
        )
    for bad in (0, -1, float("nan"), "x"):
        with pytest.raises(ValueError, match=r"^epsilon: expected a "):
            noise_multiplier(epsilon=bad, delta=1e-5)
    for bad in (0, 1, 2):
        with pytest.raises(ValueError, match=r"^delta: expected a "):
            noise_multiplier(epsilon=1.0, delta=bad)
    with pytest.raises(ValueError, match=r"^n_releases: "):
        noise_multiplier(epsilon=1.0, delta=1e-5, n_releases=0)
