"""E9: private client KD. Exact inputs from an independent numpy KD; the probability of
the same ranking against its closed form for two models."""

import math

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from experiments_testkit import clustered_clients, kd_vstat
from scipy import stats
from scipy.stats import norm

from distrank.clients import save_manifest
from distrank.experiments import Outputs
from distrank.experiments.e9_private_ranking import (
    check,
    e9_figure,
    e9_table,
    half_epsilon,
    kernel_inputs,
    nested_subsamples,
    read_kernel_inputs,
    run,
    write_kernel_inputs,
)
from distrank.metrics._kernels import median_bandwidth

RNG = np.random.default_rng(9)


def kd_ustat(x, y, bandwidth):
    """Unbiased (U-statistic) squared MMD with a Gaussian kernel, dense numpy."""

    def k(a, b):
        sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None] - 2 * a @ b.T
        return np.exp(-sq / (2 * bandwidth**2))

    kxx, kyy = k(x, x), k(y, y)
    n, m = len(x), len(y)
    return (
        (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
        + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
        - 2 * k(x, y).mean()
    )


def test_nested_subsamples():
    owner = np.array([0] * 12 + [1] * 9 + [-1] * 3 + [2] * 10)
    tier = nested_subsamples(owner, sizes=[2, 5, 8], seed=1)
    for c in (0, 1, 2):
        mine = tier[owner == c]
        assert [(mine == t).sum() for t in (0, 1, 2)] == [2, 3, 3]
    assert (tier[owner == -1] == -1).all()
    np.testing.assert_array_equal(tier, nested_subsamples(owner, sizes=[2, 5, 8], seed=1))
    with pytest.raises(ValueError, match=r"^client_sizes: client 1 has 9 rows, fewer than 10$"):
        nested_subsamples(owner, sizes=[2, 10], seed=1)


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_kernel_inputs_equal_kd_of_each_subsample(estimator):
    x, owner, _ = clustered_clients(RNG, k=3, d=4, sizes=[30, 40, 35])
    models = {f"m{i}": RNG.normal(0.3 * i, 1.0 + 0.2 * i, size=(25, 4)) for i in range(3)}
    sizes, bandwidth = [6, 15, 30], 2.0
    got = kernel_inputs(
        x,
        owner,
        models,
        sizes=sizes,
        kernel="rbf",
        bandwidth=bandwidth,
        estimator=estimator,
        seed=4,
    )
    tier = nested_subsamples(owner, sizes=sizes, seed=4)
    kd = kd_ustat if estimator == "unbiased" else kd_vstat
    for t, size in enumerate(sizes):
        keep = (tier >= 0) & (tier <= t)
        np.testing.assert_array_equal(got[size]["client_sizes"], [size] * 3)
        for g, y in enumerate(models.values()):
            assert got[size]["kd_all"][g] == pytest.approx(kd(x[keep], y, bandwidth), rel=1e-9)
            for c in range(3):
                rows = keep & (owner == c)
                assert got[size]["kd_client"][g, c] == pytest.approx(
                    kd(x[rows], y, bandwidth), rel=1e-9, abs=1e-13
                )
    with pytest.raises(ValueError, match=r"^kernel: E9 needs a bounded kernel"):
        kernel_inputs(
            x, owner, models, sizes=sizes, kernel="poly", bandwidth=1.0, estimator=estimator, seed=0
        )


def test_probability_of_the_same_ranking_has_its_closed_form():
    """Two models, KD gap D, k clients of n rows, equal weights: the private averages
    differ by N(D, 2 sigma^2 / k), so P(same order) = Phi(D / (sigma sqrt(2 / k)));
    sigma = sqrt(2) z_1(eps, delta) 4 / n, z_1 from dp-accounting's calibration."""
    k, n, gap, delta = 4, 200, 0.01, 1e-5
    kd_client = np.array([[0.05, 0.06, 0.04, 0.05], [0.05 + gap] * 4])
    kd_client[1] = kd_client[0] + gap
    inputs = {
        n: {"kd_client": kd_client, "kd_all": kd_client.mean(axis=1), "client_sizes": np.full(k, n)}
    }
    table = e9_table(inputs, epsilons=[0.3, 1.0, 3.0], delta=delta, n_draws=1500, seed=2)
    for row in table.itertuples():
        sigma = math.sqrt(2) * dp_accounting.get_sigma_gaussian(row.epsilon, delta) * 4 / n
        expected = norm.cdf(gap / (sigma * math.sqrt(2 / k)))
        assert row.noise_std == pytest.approx(sigma, rel=1e-12)
        assert row.sensitivity == 4 / n
        assert abs(row.p_same_ranking - expected) < 4 * math.sqrt(expected * (1 - expected) / 1500)
        assert row.p_low <= row.p_same_ranking <= row.p_high
        # two models: tau is +1 when the order is kept, -1 when not
        assert row.mean_kendall_tau == pytest.approx(2 * row.p_same_ranking - 1, abs=1e-12)
        assert row.p_same_best == row.p_same_ranking  # two models: the best fixes the order
        assert row.epsilon_spent == pytest.approx(row.epsilon, rel=1e-8)


def test_table_replays_its_noise_draws():
    """Noise from default_rng([seed, size, i]) with each client's std, by hand."""
    kd_client = RNG.uniform(0, 0.2, size=(5, 3))
    sizes = np.array([50, 80, 120])
    inputs = {
        50: {
            "kd_client": kd_client,
            "kd_all": kd_client @ (sizes / sizes.sum()) + 0.01,
            "client_sizes": sizes,
        }
    }
    table = e9_table(inputs, epsilons=[1.0, 10.0], delta=1e-6, n_draws=50, seed=7)
    lam = sizes / sizes.sum()
    for i, row in enumerate(table.itertuples()):
        z = math.sqrt(5) * dp_accounting.get_sigma_gaussian(row.epsilon, 1e-6)
        noise = np.random.default_rng([7, 50, i]).standard_normal((50, 5, 3)) * z * 4 / sizes
        avg = (kd_client + noise) @ lam
        truth = inputs[50]["kd_all"]
        same = [np.array_equal(np.argsort(a), np.argsort(truth)) for a in avg]
        taus = [stats.kendalltau(a, truth).statistic for a in avg]
        assert row.p_same_ranking == pytest.approx(np.mean(same), abs=1e-15)
        assert row.mean_kendall_tau == pytest.approx(np.mean(taus), rel=1e-12)
        assert row.noise_std == pytest.approx(z * 4 / 50, rel=1e-12)


def test_figure_has_a_line_per_client_size(tmp_path):
    kd_client = np.linspace(0.01, 0.2, 6)[:, None] + np.zeros((1, 3))
    inputs = {
        n: {"kd_client": kd_client, "kd_all": kd_client[:, 0], "client_sizes": np.full(3, n)}
        for n in (50, 100, 400)
    }
    table = e9_table(inputs, epsilons=[0.1, 1.0, 10.0], delta=1e-5, n_draws=20)
    assert len(table) == 9
    fig = e9_figure(table)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 2
    crossing = sum(not np.isnan(half_epsilon(g)) for _, g in table.groupby("client_size"))
    # (a): the 1/2 line, same ranking and same best per size, a mark where P reaches 1/2
    for ax, n_lines in zip(axes, (1 + 6 + crossing, 3)):
        assert ax.get_xscale() == "log" and len(ax.get_lines()) == n_lines
        assert "varepsilon" in ax.get_xlabel() and ax.get_ylabel()
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == 3 and all(label.startswith("$n_i$ = ") for label in labels)
    fig.savefig(tmp_path / "e9.png")


def test_half_epsilon_interpolates_in_log_epsilon():
    rows = pd.DataFrame({"epsilon": [100.0, 1.0, 10.0], "p_same_ranking": [0.8, 0.0, 0.2]})
    assert half_epsilon(rows) == pytest.approx(10**1.5, rel=1e-12)  # halfway 0.2 -> 0.8
    assert half_epsilon(rows.assign(p_same_ranking=[0.9, 0.6, 0.7])) == 1.0
    assert np.isnan(half_epsilon(rows.assign(p_same_ranking=[0.4, 0.0, 0.1])))


def test_check_names_the_key():
    config = {"models": {"real": {}}, "metrics": {"kd_estimator": "unbiased"}}
    settings = {"bandwidth_from": "real", "client_sizes": [10, 20]}
    check(settings, config)
    with pytest.raises(
        ValueError,
        match=r"^config: experiments\.E9\.bandwidth_from 'nope' is not a model of `models`$",
    ):
        check({**settings, "bandwidth_from": "nope"}, config)
    with pytest.raises(ValueError, match=r"^config: experiments\.E9\.client_sizes must increase"):
        check({**settings, "client_sizes": [20, 10]}, config)
    with pytest.raises(
        ValueError,
        match=r"^config: experiments\.E9 needs metrics\.kd_estimator 'unbiased' or 'biased'",
    ):
        check(settings, {**config, "metrics": {"kd_estimator": "subsets"}})


def test_files_to_outputs(tmp_path):
    x, owner, _ = clustered_clients(RNG, k=3, d=4, sizes=[30, 40, 35])
    models = {"real": RNG.normal(size=(20, 4)), "other": RNG.normal(0.5, 1, size=(20, 4))}
    np.savez(tmp_path / "reference.npz", features=x)
    save_manifest(tmp_path / "manifest.csv", owner)
    paths = {}
    for name, y in models.items():
        paths[name] = tmp_path / f"model_{name}.npz"
        np.savez(paths[name], features=y)
    out = tmp_path / "E9" / "kernel_inputs.npz"
    write_kernel_inputs(
        tmp_path / "reference.npz",
        tmp_path / "manifest.csv",
        paths,
        out,
        sizes=[10, 30],
        kernel="rbf",
        bandwidth_from="real",
        estimator="unbiased",
        seed=0,
    )
    back = read_kernel_inputs(out)
    expected = kernel_inputs(
        x,
        owner,
        models,
        sizes=[10, 30],
        kernel="rbf",
        bandwidth=median_bandwidth(models["real"], kernel="rbf", seed=0),
        estimator="unbiased",
        seed=0,
    )
    assert list(back) == [10, 30]
    for size in back:
        np.testing.assert_array_equal(back[size]["kd_client"], expected[size]["kd_client"])
        assert list(back[size]["models"]) == ["real", "other"]
    settings = {"epsilons": [1.0, 10.0], "delta": 1e-5, "n_draws": 10}
    context = {
        "seed": 0,
        "metrics": {"kd_estimator": "unbiased", "weights": "size"},
        "extractor": "efficientnet_lite0",
        "models": [],
    }
    result = run({"kernel_inputs": str(out)}, settings, context)
    assert isinstance(result, Outputs) and set(result.tables) == {""} == set(result.figures)
    assert isinstance(result.tables[""], pd.DataFrame) and len(result.tables[""]) == 4
