"""Bootstrap intervals: re-weighted KD equals KD of the resampled rows, and the intervals
equal those of a naive loop that rescores every resample (same seed, same resamples)."""

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics.pairwise import laplacian_kernel, polynomial_kernel, rbf_kernel

from distrank.metrics import make_kernel, score
from distrank.metrics._bootstrap import (
    ScoreCube,
    bootstrap_scores,
    flat_summary,
    model_pairs,
    pairwise_intervals,
    pairwise_summary,
    score_intervals,
)
from distrank.metrics.kd import kernel_distance, kernel_sums
from distrank.metrics.kd._resample import resampled_kernel_sums, row_counts

RNG = np.random.default_rng(20240614)


def small_study(d=3):
    x = RNG.normal(size=(26, d))
    clients = np.repeat(["p", "q", "r"], [7, 9, 10])
    models = {
        "g": RNG.normal(size=(8, d)),
        "h": RNG.normal(0.4, 1.1, size=(10, d)),
        "i": RNG.normal(-0.2, 0.8, size=(9, d)),
    }
    return x, clients, models


def gram(kernel, params, a, b):
    """Kernel matrix from scikit-learn, in distrank's parametrisation."""
    if kernel == "poly":
        return polynomial_kernel(a, b, degree=3, gamma=1.0 / a.shape[1], coef0=1.0)
    if kernel == "rbf":
        return rbf_kernel(a, b, gamma=1.0 / (2 * params["bandwidth"] ** 2))
    return laplacian_kernel(a, b, gamma=1.0 / params["bandwidth"])


def resampled_kd(kernel, params, x, x_ids, x_client, y, y_ids, estimator):
    """KD of resampled rows, by definition (module doc of distrank.metrics._bootstrap):
    V: the V statistic of the rows as drawn. U: pairs of draws of the same original row
    (same id) left out, each within-sample block sum rescaled by n_a / (n_a - 1)."""
    n, m = len(x), len(y)
    kxy = gram(kernel, params, x, y).mean()
    if estimator == "biased":
        return gram(kernel, params, x, x).mean() + gram(kernel, params, y, y).mean() - 2 * kxy
    kyy = gram(kernel, params, y, y) * (y_ids[:, None] != y_ids[None, :])
    kxx = gram(kernel, params, x, x) * (x_ids[:, None] != x_ids[None, :])
    same = x_client[:, None] == x_client[None, :]
    within = sum(
        (kxx * same)[np.ix_(x_client == c, x_client == c)].sum()
        * (x_client == c).sum()
        / ((x_client == c).sum() - 1)
        for c in np.unique(x_client)
    )
    xx = (within + (kxx * ~same).sum()) / (n * (n - 1))
    return xx + kyy.sum() / (m * (m - 1)) * m / (m - 1) - 2 * kxy


def multinomial_counts(index, ys, n_res):
    """Bootstrap counts drawn here: reference rows within each client, and each model's."""
    counts = np.zeros((n_res, len(index)), dtype=np.int64)
    for c in np.unique(index):
        rows = np.flatnonzero(index == c)
        counts[:, rows] = RNG.multinomial(len(rows), np.full(len(rows), 1 / len(rows)), n_res)
    return counts, [RNG.multinomial(len(y), np.full(len(y), 1 / len(y)), n_res) for y in ys]


def test_row_counts_count_the_draws():
    draws = np.array([[0, 0, 3, 1], [2, 2, 2, 2]])
    np.testing.assert_array_equal(row_counts(draws, 5), [[2, 1, 0, 1, 0], [0, 0, 4, 0, 0]])


@pytest.mark.parametrize(
    "kernel,params", [("poly", None), ("rbf", {"bandwidth": 1.3}), ("laplace", {"bandwidth": 2.0})]
)
@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_reweighted_sums_give_the_kd_of_the_resampled_rows(kernel, params, estimator):
    """Counts c_r -> the rows repeated c_r times, scored by definition (dense kernels)."""
    x, clients, models = small_study()
    index = np.unique(clients, return_inverse=True)[1]
    kern = make_kernel(kernel, params, x.shape[1])
    ys = list(models.values())
    n_res = 4
    counts, model_counts = multinomial_counts(index, ys, n_res)
    sums = resampled_kernel_sums(
        x, index, ys, kern, counts, model_counts, estimator=estimator, dtype="float64", block_size=4
    )
    for b in range(n_res):
        per_client, pooled = sums[b].kd(estimator)
        ids = np.repeat(np.arange(len(x)), counts[b])
        for g, y in enumerate(ys):
            y_ids = np.repeat(np.arange(len(y)), model_counts[g][b])
            expected = resampled_kd(
                kernel, params, x[ids], ids, index[ids], y[y_ids], y_ids, estimator
            )
            assert pooled[g] == pytest.approx(expected, rel=1e-10, abs=1e-12)
            for c in range(3):
                mine = ids[index[ids] == c]
                expected = resampled_kd(
                    kernel, params, x[mine], mine, index[mine], y[y_ids], y_ids, estimator
                )
                assert per_client[g, c] == pytest.approx(expected, rel=1e-10, abs=1e-12)
            if estimator == "biased":  # the V statistic of the rows as drawn
                assert pooled[g] == pytest.approx(
                    kernel_distance(
                        x[ids],
                        y[y_ids],
                        kernel=kernel,
                        kernel_params=params,
                        estimator="biased",
                        dtype="float64",
                    ),
                    rel=1e-10,
                    abs=1e-12,
                )


def test_resampled_u_statistic_is_unbiased_for_the_sample_kd():
    """E*[KD*] = KD (U form) for every client and the pool: the mean of 4000 resamples
    is within 4 standard errors; the V form's plug-in mean is off by its O(1/n) bias."""
    x, clients, models = small_study()
    index = np.unique(clients, return_inverse=True)[1]
    kern = make_kernel("poly", None, x.shape[1])
    ys = list(models.values())
    n_res = 4000
    counts, model_counts = multinomial_counts(index, ys, n_res)
    exact = kernel_sums(x, index, ys, kern, dtype="float64")
    for estimator in ("unbiased", "biased"):
        sums = resampled_kernel_sums(
            x, index, ys, kern, counts, model_counts, estimator=estimator, dtype="float64"
        )
        draws = np.array(
            [np.column_stack([s.kd(estimator)[1], s.kd(estimator)[0]]) for s in sums]
        )  # (B, M, 1 + k)
        point = np.column_stack([exact.kd(estimator)[1], exact.kd(estimator)[0]])
        z = (draws.mean(axis=0) - point) / (draws.std(axis=0) / np.sqrt(n_res))
        if estimator == "unbiased":
            assert np.abs(z).max() < 4
        else:
            assert np.abs(z).max() > 10


def test_unit_counts_give_the_kernel_sums_of_the_data():
    """The V form of the all-ones resample is the data (the U form rescales for E*)."""
    x, clients, models = small_study()
    index = np.unique(clients, return_inverse=True)[1]
    kern = make_kernel("poly", None, x.shape[1])
    ys = list(models.values())
    ref = kernel_sums(x, index, ys, kern, dtype="float64", block_size=7)
    sums = resampled_kernel_sums(
        x,
        index,
        ys,
        kern,
        np.ones((1, len(x))),
        [np.ones((1, len(y))) for y in ys],
        estimator="biased",
        dtype="float64",
        block_size=5,
    )[0]
    for field in ("xx", "xx_diag", "xy", "yy", "yy_diag"):
        np.testing.assert_allclose(getattr(sums, field), getattr(ref, field), rtol=1e-12)
    np.testing.assert_array_equal(sums.client_sizes, ref.client_sizes)


def naive_kd_statistic(x, clients, models, *, kernel, params, estimator):
    """scipy statistic that takes the drawn row indices of every client and model,
    builds the resampled rows and scores each resample by definition, one by one."""
    names = sorted(set(clients))
    rows = [np.flatnonzero(clients == c) for c in names]
    ys = list(models.values())

    def statistic(*draws, axis=-1):
        client_draws, model_draws = draws[: len(rows)], draws[len(rows) :]
        out = []
        for b in range(client_draws[0].shape[0]):
            parts = [r[d[b]] for r, d in zip(rows, client_draws)]
            ids = np.concatenate(parts)
            owner = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
            sizes = np.array([len(p) for p in parts])
            pooled, avg = [], []
            for y, d in zip(ys, model_draws):
                yb = y[d[b]]
                pooled.append(resampled_kd(kernel, params, x[ids], ids, owner, yb, d[b], estimator))
                local = [
                    resampled_kd(kernel, params, x[p], p, np.zeros(len(p)), yb, d[b], estimator)
                    for p in parts
                ]
                avg.append(sizes @ local / sizes.sum())
            pooled, avg = np.array(pooled), np.array(avg)
            g, h = np.array(model_pairs(len(ys))).T
            out.append(
                np.concatenate(
                    [
                        pooled[g] - pooled[h],
                        avg[g] - avg[h],
                        [stats.kendalltau(avg, pooled).statistic],
                    ]
                )
            )
        return np.array(out).T

    data = [np.arange(len(r)) for r in rows] + [np.arange(len(y)) for y in ys]
    return statistic, data


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_kd_intervals_equal_a_naive_resampling_loop(estimator):
    x, clients, models = small_study()
    params = {"bandwidth": 1.5}
    mine = bootstrap_scores(
        x,
        clients,
        models,
        summary=pairwise_summary,
        metrics=("kd",),
        n_resamples=60,
        seed=11,
        batch=25,
        kernel="rbf",
        kernel_params=params,
        kd_estimator=estimator,
        dtype="float64",
        block_size=4,
    )
    statistic, data = naive_kd_statistic(
        x, clients, models, kernel="rbf", params=params, estimator=estimator
    )
    naive = stats.bootstrap(
        data,
        statistic,
        n_resamples=60,
        batch=25,
        paired=False,
        method="percentile",
        rng=np.random.default_rng(11),
    )
    np.testing.assert_allclose(
        mine.distribution, naive.bootstrap_distribution, rtol=1e-9, atol=1e-13
    )
    np.testing.assert_allclose(mine.low, naive.confidence_interval.low, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(mine.high, naive.confidence_interval.high, rtol=1e-9, atol=1e-13)
    # and by hand: scipy draws each sample's (batch, n) indices in turn from the seed
    rng = np.random.default_rng(11)
    draws = [rng.integers(0, len(d), (25, len(d))) for d in data]
    np.testing.assert_allclose(statistic(*draws), mine.distribution[:, :25], rtol=1e-9, atol=1e-13)
    pct = np.percentile(naive.bootstrap_distribution, [2.5, 97.5], axis=-1)
    np.testing.assert_allclose(mine.low, pct[0], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(mine.high, pct[1], rtol=1e-12, atol=1e-15)


def test_theorem_1_holds_in_every_resample():
    """Size weights: the KD_avg and KD_all differences agree in every resample and tau = 1."""
    x, clients, models = small_study()
    result = bootstrap_scores(
        x,
        clients,
        models,
        summary=pairwise_summary,
        metrics=("kd",),
        n_resamples=200,
        seed=2,
        dtype="float64",
    )
    n_pairs = len(model_pairs(len(models)))
    pooled, avg = result.distribution[:n_pairs], result.distribution[n_pairs : 2 * n_pairs]
    np.testing.assert_allclose(avg, pooled, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(result.distribution[-1], 1.0)
    pairs, tau = pairwise_intervals(result)
    assert tau.kendall_tau.item() == 1.0 and tau.low.item() == 1.0 and tau.high.item() == 1.0
    assert len(pairs) == 2 * n_pairs and set(pairs.aggregation) == {"all", "avg"}
    assert (pairs.low <= pairs.high).all()


def test_fd_and_prdc_resamples_are_scored_afresh():
    x, clients, models = small_study(d=2)
    options = dict(pr_k=2, dc_k=2, dtype="float64")
    mine = bootstrap_scores(
        x,
        clients,
        models,
        summary=flat_summary,
        metrics=("fd", "precision", "coverage"),
        n_resamples=6,
        seed=4,
        **options,
    )
    names = sorted(set(clients))
    rows = [np.flatnonzero(clients == c) for c in names]
    ys = list(models.values())
    rng = np.random.default_rng(4)
    draws = [rng.integers(0, len(r), (6, len(r))) for r in rows] + [
        rng.integers(0, len(y), (6, len(y))) for y in ys
    ]
    for b in range(6):
        picked = np.concatenate([r[d[b]] for r, d in zip(rows, draws)])
        table = score(
            x[picked],
            clients[picked],
            {g: y[d[b]] for g, y, d in zip(models, ys, draws[len(rows) :])},
            metrics=("fd", "precision", "coverage"),
            **options,
        )
        cube = ScoreCube.from_table(
            table, mine.point.metrics, mine.point.models, mine.point.clients
        )
        np.testing.assert_allclose(mine.distribution[:, b], cube.values.ravel(), rtol=1e-12)
    table = score_intervals(mine)
    exact = score(x, clients, models, metrics=("fd", "precision", "coverage"), **options)
    merged = table.merge(exact, on=["model", "metric", "aggregation", "client"])
    assert len(merged) == len(exact) == len(table)
    np.testing.assert_array_equal(merged.value_x, merged.value_y)
    lo, hi = np.percentile(mine.distribution, [2.5, 97.5], axis=-1)
    cube = mine.point
    aggs = ["all", "avg", *cube.clients]
    for row in table.itertuples():
        j = np.ravel_multi_index(
            (
                cube.metrics.index(row.metric),
                cube.models.index(row.model),
                aggs.index(row.client or row.aggregation),
            ),
            cube.values.shape,
        )
        assert (row.low, row.high) == pytest.approx((lo[j], hi[j]), rel=1e-12)


def test_pairwise_point_values():
    x, clients, models = small_study()
    result = bootstrap_scores(
        x,
        clients,
        models,
        summary=pairwise_summary,
        metrics=("kd", "fd"),
        n_resamples=3,
        seed=0,
        dtype="float64",
    )
    pairs, tau = pairwise_intervals(result)
    exact = score(x, clients, models, metrics=("kd", "fd"), dtype="float64")
    value = exact.set_index(["metric", "model", "aggregation"]).value
    for row in pairs.itertuples():
        expected = (
            value[(row.metric, row.model_a, row.aggregation)]
            - value[(row.metric, row.model_b, row.aggregation)]
        )
        assert row.difference == pytest.approx(expected, rel=1e-12, abs=1e-15)
    fd_avg = [value[("fd", g, "avg")] for g in models]
    fd_all = [value[("fd", g, "all")] for g in models]
    assert tau.set_index("metric").kendall_tau["fd"] == pytest.approx(
        stats.kendalltau(fd_avg, fd_all).statistic, rel=1e-15
    )
    assert (tau.n_resamples == 3).all()


def test_bootstrap_checks_its_arguments():
    x, clients, models = small_study()
    with pytest.raises(ValueError, match=r"^n_resamples: "):
        bootstrap_scores(x, clients, models, summary=flat_summary, metrics=("kd",), n_resamples=0)
    with pytest.raises(ValueError, match=r"^confidence_level: "):
        bootstrap_scores(
            x, clients, models, summary=flat_summary, metrics=("kd",), confidence_level=1.5
        )
    with pytest.raises(
        ValueError,
        match=r"^kd_estimator: expected .unbiased. or .biased. \(bootstrap KD re-weights",
    ):
        bootstrap_scores(
            x, clients, models, summary=flat_summary, metrics=("kd",), kd_estimator="subsets"
        )
    with pytest.raises(ValueError, match=r"^metrics: expected a non-empty subset"):
        bootstrap_scores(x, clients, models, summary=flat_summary, metrics=("nope",))
