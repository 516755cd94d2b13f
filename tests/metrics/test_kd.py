"""Kernel distance: values from torch-fidelity and scikit-learn, Theorem 1 on finite samples."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import pdist
from sklearn.metrics.pairwise import (
    laplacian_kernel,
    linear_kernel,
    polynomial_kernel,
    rbf_kernel,
)
from torch_fidelity.metric_kid import kernel_poly, kid_features_to_metric, mmd2

from distrank.metrics import make_kernel, median_bandwidth, score
from distrank.metrics._kernels import gram_blocks
from distrank.metrics.kd import kernel_distance, kernel_sums
from distrank.metrics.kd._subsets import subset_kd

RNG = np.random.default_rng(20231017)


def sklearn_gram(name, a, b, bandwidth=1.5):
    """Kernel matrices from scikit-learn, in our parametrisation."""
    if name == "poly":
        return polynomial_kernel(a, b, degree=3, gamma=1.0 / a.shape[1], coef0=1.0)
    if name == "rbf":
        return rbf_kernel(a, b, gamma=1.0 / (2 * bandwidth**2))
    if name == "laplace":
        return laplacian_kernel(a, b, gamma=1.0 / bandwidth)
    return linear_kernel(a, b)


def dense_mmd2(name, x, y, estimator, bandwidth=1.5):
    """Squared MMD from full kernel matrices (Gretton et al. 2012, eqs. 3 and 5)."""
    kxx, kyy = sklearn_gram(name, x, x, bandwidth), sklearn_gram(name, y, y, bandwidth)
    kxy = sklearn_gram(name, x, y, bandwidth)
    n, m = len(x), len(y)
    if estimator == "biased":
        return kxx.mean() + kyy.mean() - 2 * kxy.mean()
    return (
        (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
        + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
        - 2 * kxy.mean()
    )


def params(name, bandwidth=1.5):
    return {"bandwidth": bandwidth} if name in ("rbf", "laplace") else None


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_poly_kd_equals_torch_fidelity_mmd2(estimator):
    x = RNG.normal(size=(40, 7))
    y = RNG.normal(0.3, 1.2, size=(40, 7))
    expected = mmd2(kernel_poly(x, x), kernel_poly(x, y), kernel_poly(y, y), mmd_est=estimator)
    got = kernel_distance(x, y, estimator=estimator, dtype="float64", block_size=16)
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", ["poly", "rbf", "laplace", "linear"])
@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_kd_equals_dense_sklearn_kernels(name, estimator):
    x = RNG.normal(size=(37, 5))
    y = RNG.normal(0.5, 0.8, size=(23, 5))
    got = kernel_distance(
        x,
        y,
        kernel=name,
        kernel_params=params(name),
        estimator=estimator,
        dtype="float64",
        block_size=8,
    )
    assert got == pytest.approx(dense_mmd2(name, x, y, estimator), rel=1e-10, abs=1e-14)


def test_client_rows_equal_per_client_kd():
    x = RNG.normal(size=(60, 4))
    clients = RNG.integers(0, 3, size=60)
    y = RNG.normal(0.2, 1.0, size=(30, 4))
    table = score(x, clients, {"g": y}, metrics=["kd"], dtype="float64", block_size=7)
    rows = table.set_index(["aggregation", "client"]).value
    for c in range(3):
        expected = dense_mmd2("poly", x[clients == c], y, "unbiased")
        assert rows["client", str(c)] == pytest.approx(expected, rel=1e-10)
    assert rows["all", ""] == pytest.approx(dense_mmd2("poly", x, y, "unbiased"), rel=1e-10)


def test_blocking_does_not_change_the_sums():
    x = torch.from_numpy(RNG.normal(size=(50, 6)))
    index = RNG.integers(0, 4, size=50)
    ys = [torch.from_numpy(RNG.normal(size=(m, 6))) for m in (13, 31)]
    kern = make_kernel("poly", None, 6)
    small = kernel_sums(x, index, ys, kern, dtype="float64", block_size=3)
    large = kernel_sums(x, index, ys, kern, dtype="float64", block_size=4096)
    for field in ("xx", "xx_diag", "xy", "yy", "yy_diag"):
        np.testing.assert_allclose(getattr(small, field), getattr(large, field), rtol=1e-12)


@pytest.mark.parametrize("block", [5, 23, 64])
def test_gram_blocks_are_the_products_on_and_above_the_diagonal(block):
    """Every pair of rows once, as numpy's product (a block on the diagonal is made of
    its sub-blocks on and above it, mirrored)."""
    x = torch.from_numpy(RNG.normal(size=(23, 6)))
    full, seen = x.numpy() @ x.numpy().T, np.zeros((23, 23), dtype=int)
    for rows, cols, gram in gram_blocks(x, None, block):
        np.testing.assert_allclose(gram.numpy(), full[rows, cols], rtol=1e-13, atol=1e-13)
        seen[rows, cols] += 1
    assert (seen[np.triu_indices(23)] == 1).all()


@st.composite
def federations(draw):
    """Random client sizes, dimension and model sizes; features drawn from them."""
    sizes = draw(st.lists(st.integers(2, 12), min_size=1, max_size=5))
    d = draw(st.integers(1, 5))
    model_sizes = draw(st.lists(st.integers(2, 15), min_size=2, max_size=4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    clients = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    # heterogeneous clients: each has its own mean
    x = rng.normal(size=(len(clients), d)) + rng.normal(scale=2, size=(len(sizes), d))[clients]
    models = {
        f"g{i}": rng.normal(rng.normal(), rng.uniform(0.5, 2), size=(m, d))
        for i, m in enumerate(model_sizes)
    }
    return x, clients, models


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    federation=federations(),
    estimator=st.sampled_from(["unbiased", "biased"]),
    kernel=st.sampled_from(["poly", "rbf", "laplace", "linear"]),
    block_size=st.sampled_from([3, 4096]),
)
def test_theorem1_kd_gap_is_the_same_for_every_model(federation, estimator, kernel, block_size):
    x, clients, models = federation
    table = score(
        x,
        clients,
        models,
        metrics=["kd"],
        kernel=kernel,
        kd_estimator=estimator,
        kernel_params=params(kernel),
        dtype="float64",
        block_size=block_size,
    )
    wide = table[table.aggregation != "client"].pivot(
        index="model", columns="aggregation", values="value"
    )
    gap = (wide["avg"] - wide["all"]).to_numpy()
    scale = max(np.abs(wide.to_numpy()).max(), np.abs(gap).max(), 1e-300)
    assert (gap.max() - gap.min()) / scale < 1e-9


@pytest.mark.parametrize("name", ["poly", "rbf"])
def test_subsets_equal_torch_fidelity_kid(name):
    x = RNG.normal(size=(60, 4))
    clients = np.repeat([0, 1], [35, 25])
    y = RNG.normal(0.3, 1.0, size=(50, 4))
    bandwidth = 2.0
    table = score(
        x,
        clients,
        {"g": y},
        metrics=["kd"],
        kernel=name,
        kernel_params=params(name, bandwidth),
        kd_estimator="subsets",
        n_subsets=6,
        subset_size=20,
        seed=7,
        dtype="float64",
    )
    rows = table.set_index(["metric", "aggregation", "client"]).value
    for part, key in ((x, ("all", "")), (x[clients == 1], ("client", "1"))):
        kid = kid_features_to_metric(
            torch.from_numpy(y),
            torch.from_numpy(part),
            kid_subsets=6,
            kid_subset_size=20,
            rng_seed=7,
            verbose=False,
            kid_kernel=name,
            kid_kernel_rbf_sigma=bandwidth,
        )
        assert rows[("kd", *key)] == pytest.approx(kid["kernel_inception_distance_mean"], rel=1e-10)
        assert rows[("kd_std", *key)] == pytest.approx(
            kid["kernel_inception_distance_std"], rel=1e-10
        )
    assert ("kd_std", "avg", "") not in rows.index


def kid_by_subset(name, x, y, n_subsets, size, seed, bandwidth=1.5):
    """KID with torch-fidelity's draws, each subset's three kernels from scikit-learn."""
    rng = np.random.RandomState(seed)
    values = []
    for _ in range(n_subsets):
        ys = y[rng.choice(len(y), size, replace=False)]
        xs = x[rng.choice(len(x), size, replace=False)]
        kxx, kyy = sklearn_gram(name, xs, xs, bandwidth), sklearn_gram(name, ys, ys, bandwidth)
        within = kxx.sum() - np.trace(kxx) + kyy.sum() - np.trace(kyy)
        values.append(
            within / (size * (size - 1)) - 2 * sklearn_gram(name, xs, ys, bandwidth).sum() / size**2
        )
    return np.mean(values), np.std(values)


@pytest.mark.parametrize("name", ["poly", "rbf", "laplace"])
@pytest.mark.parametrize("block_size", [7, 4096])
def test_subsets_of_every_client_and_model_equal_per_subset_kernels(name, block_size):
    # shuffled client labels, models of different sizes, blocks that cut across clients
    x = RNG.normal(size=(70, 3))
    clients = RNG.permutation(np.repeat([2, 0, 1], [30, 25, 15]))
    models = {"a": RNG.normal(0.2, 1.0, size=(24, 3)), "b": RNG.normal(size=(31, 3))}
    models["c"] = RNG.normal(-0.1, 1.1, size=(24, 3))
    table = score(
        x,
        clients,
        models,
        metrics=["kd"],
        kernel=name,
        kernel_params=params(name),
        kd_estimator="subsets",
        n_subsets=5,
        subset_size=11,
        seed=4,
        dtype="float64",
        block_size=block_size,
    )
    rows = table.set_index(["model", "metric", "aggregation", "client"]).value
    parts = {("all", ""): x} | {("client", str(c)): x[clients == c] for c in range(3)}
    for g, y in models.items():
        for key, part in parts.items():
            mean, std = kid_by_subset(name, part, y, 5, 11, 4)
            assert rows[(g, "kd", *key)] == pytest.approx(mean, rel=1e-10)
            assert rows[(g, "kd_std", *key)] == pytest.approx(std, rel=1e-10)


def test_kd_subsets_of_one_pair_equal_torch_fidelity_kid():
    x, y = RNG.normal(size=(40, 6)), RNG.normal(0.3, 1.0, size=(35, 6))
    means, stds = subset_kd(
        x,
        None,
        [y],
        make_kernel("poly", None, 6),
        n_subsets=4,
        subset_size=20,
        seed=9,
        dtype="float64",
    )
    mean, std = float(means[0, 0]), float(stds[0, 0])
    kid = kid_features_to_metric(
        torch.from_numpy(y),
        torch.from_numpy(x),
        kid_subsets=4,
        kid_subset_size=20,
        rng_seed=9,
        verbose=False,
    )
    assert mean == pytest.approx(kid["kernel_inception_distance_mean"], rel=1e-10)
    assert std == pytest.approx(kid["kernel_inception_distance_std"], rel=1e-10)


def test_float32_subsets_are_close_to_float64():
    x = RNG.normal(size=(300, 32)).astype(np.float32)
    clients = RNG.integers(0, 3, size=300)
    y = RNG.normal(0.1, 1.0, size=(200, 32)).astype(np.float32)
    f32, f64 = (
        score(
            x,
            clients,
            {"g": y},
            metrics=["kd"],
            kd_estimator="subsets",
            n_subsets=10,
            subset_size=50,
            dtype=dt,
            block_size=64,
        ).value
        for dt in ("float32", "float64")
    )
    np.testing.assert_allclose(f32, f64, rtol=0, atol=1e-5)


def test_float32_products_are_close_to_float64():
    x = RNG.normal(size=(600, 64)).astype(np.float32)
    clients = RNG.integers(0, 4, size=600)
    models = {
        "near": RNG.normal(0.05, 1.0, size=(300, 64)).astype(np.float32),
        "far": RNG.normal(0.3, 1.0, size=(300, 64)).astype(np.float32),
    }
    f32, f64 = (
        score(x, clients, models, metrics=["kd"], dtype=dt, block_size=128).value
        for dt in ("float32", "float64")
    )
    # KD is a difference of O(1) terms: compare on that scale
    np.testing.assert_allclose(f32, f64, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name,metric", [("rbf", "euclidean"), ("laplace", "cityblock")])
def test_median_bandwidth_is_the_median_pairwise_distance(name, metric):
    x = RNG.normal(size=(80, 3))
    assert median_bandwidth(x, kernel=name) == pytest.approx(np.median(pdist(x, metric)), rel=1e-12)
    rows = np.random.default_rng(5).choice(80, size=30, replace=False)
    assert median_bandwidth(x, kernel=name, max_rows=30, seed=5) == pytest.approx(
        np.median(pdist(x[rows], metric)), rel=1e-12
    )


def test_score_uses_one_median_bandwidth_from_the_pooled_reference():
    x = RNG.normal(size=(40, 3))
    clients = np.repeat([0, 1], 20)
    y = RNG.normal(size=(25, 3))
    bandwidth = median_bandwidth(x, kernel="rbf")
    table = score(x, clients, {"g": y}, metrics=["kd"], kernel="rbf", dtype="float64")
    rows = table.set_index(["aggregation", "client"]).value
    assert rows["client", "1"] == pytest.approx(
        dense_mmd2("rbf", x[20:], y, "unbiased", bandwidth), rel=1e-10
    )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"kernel": "cosine"}, "kernel: expected one of"),
        ({"kernel_params": {"sigma": 1.0}}, r"kernel_params: unknown parameter\(s\) \['sigma'\]"),
        ({"kernel": "rbf", "kernel_params": {"bandwidth": -1}}, "bandwidth must be positive"),
        ({"kernel_params": {"degree": 2.5}}, "degree: expected an integer >= 1"),
        ({"kd_estimator": "mmd"}, "kd_estimator: expected one of"),
        ({"kd_estimator": "subsets", "subset_size": 9}, r"client '1' has 3 rows; KD subsets"),
    ],
)
def test_bad_kd_options_are_named(kwargs, match):
    x = RNG.normal(size=(12, 3))
    clients = np.repeat([0, 1], [9, 3])
    with pytest.raises(ValueError, match=match):
        score(x, clients, {"g": RNG.normal(size=(10, 3))}, metrics=["kd"], **kwargs)


def test_unbiased_kd_needs_two_rows_per_client_and_model():
    x = RNG.normal(size=(5, 2))
    with pytest.raises(ValueError, match=r"clients: client 'b' has 1 row; the unbiased KD"):
        score(x, ["a", "a", "a", "a", "b"], {"g": RNG.normal(size=(4, 2))}, metrics=["kd"])
    with pytest.raises(ValueError, match=r"models\['g'\] has 1 row;"):
        score(x, [0] * 5, {"g": RNG.normal(size=(1, 2))}, metrics=["kd"])
    # the V-statistic is defined for single rows
    table = score(
        x, [0, 0, 0, 0, 1], {"g": RNG.normal(size=(1, 2))}, metrics=["kd"], kd_estimator="biased"
    )
    assert np.isfinite(table.value).all()
