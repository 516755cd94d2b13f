"""Many partitions of one pool from shared sums (distrank.metrics._reaggregate), against
distrank.metrics.score run on each partition afresh."""

import numpy as np
import pytest

from distrank.clients import common_refinement
from distrank.metrics import make_kernel, score
from distrank.metrics._reaggregate import score_partitions
from distrank.metrics.kd import kernel_sums

KEYS = ["model", "metric", "aggregation", "client"]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    n, d = 240, 12
    labels = np.repeat(np.arange(6), 40)
    x = rng.standard_normal((n, d)) + 2.0 * rng.standard_normal((6, d))[labels]
    models = {
        f"g{i}": (0.4 + 0.3 * i) * rng.standard_normal((60 + 15 * i, d)) + 0.1 * i for i in range(4)
    }
    blocks = np.arange(n) // 8  # 30 blocks of one class each
    partitions = {
        "blocks_mod3": blocks % 3,
        "by_class": labels,
        "scattered": (blocks * 7) % 5,
        "named": np.array(["north", "south"])[blocks % 2],  # str labels, as score takes
    }
    return x, models, partitions


def _compare(got, want, *, kd_rtol, fd_rtol):
    assert list(got.columns) == list(want.columns)
    assert (got[KEYS].to_numpy() == want[KEYS].to_numpy()).all()
    for metric in want["metric"].unique():
        a = got.loc[got.metric == metric, "value"].to_numpy()
        b = want.loc[want.metric == metric, "value"].to_numpy()
        if metric in ("kd", "fd"):
            np.testing.assert_allclose(
                a, b, rtol=kd_rtol if metric == "kd" else fd_rtol, atol=0, err_msg=metric
            )
        else:  # PRDC counts the same hits: equal to the last digit
            np.testing.assert_array_equal(a, b, err_msg=metric)


@pytest.mark.parametrize(
    "options",
    [
        {"dtype": "float64"},
        {
            "dtype": "float64",
            "kernel": "rbf",
            "kd_estimator": "biased",
            "weights": "uniform",
            "pr_k": 2,
            "dc_k": 4,
        },
        {"dtype": "float32"},
        {"dtype": "float64", "kd_estimator": "subsets", "subset_size": 40, "n_subsets": 5},
    ],
)
def test_equals_scoring_each_partition_afresh(data, options):
    x, models, partitions = data
    table = score_partitions(x, partitions, models, **options)
    assert list(table["partition"].unique()) == list(partitions)
    for name, clients in partitions.items():
        got = table[table.partition == name].drop(columns="partition").reset_index(drop=True)
        want = score(x, clients, models, **options)
        kd_rtol = 1e-12 if options["dtype"] == "float64" else 1e-6
        _compare(got, want, kd_rtol=kd_rtol, fd_rtol=1e-10)


def test_coarsened_sums_equal_the_partitions_own(data):
    """Theorem-1 bookkeeping: a coarse partition's kernel sums are sums of fine blocks."""
    x, models, partitions = data
    kernel = make_kernel("poly", None, x.shape[1])
    fine = common_refinement(list(partitions.values())[:3])
    fine_sums = kernel_sums(x, fine, models.values(), kernel, dtype="float64")
    clients = partitions["scattered"]
    first = np.unique(fine, return_index=True)[1]
    coarse = fine_sums.coarsen(clients[first])
    direct = kernel_sums(x, clients, models.values(), kernel, dtype="float64")
    for field in ("client_sizes", "model_sizes", "xx", "xx_diag", "xy", "yy", "yy_diag"):
        np.testing.assert_allclose(
            getattr(coarse, field), getattr(direct, field), rtol=1e-12, err_msg=field
        )


def test_common_refinement_is_the_coarsest_common_split():
    a = np.array([0, 0, 0, 1, 1, 1])
    b = np.array([0, 0, 1, 1, 2, 2])
    fine = common_refinement([a, b])
    # rows share a group exactly when both partitions agree on them
    same = fine[:, None] == fine[None, :]
    assert np.array_equal(same, (a[:, None] == a[None, :]) & (b[:, None] == b[None, :]))
    assert fine.max() + 1 == 4


def test_bad_inputs(data):
    x, models, partitions = data
    with pytest.raises(ValueError, match=r"partitions\['short'\]"):
        score_partitions(x, {"short": np.zeros(5, int)}, models)
    tiny = np.zeros(len(x), int)
    tiny[:3] = 1
    with pytest.raises(ValueError, match=r"partitions\['tiny'\]: clients: client '1' has 3 rows"):
        score_partitions(x, {"tiny": tiny}, models)
    with pytest.raises(ValueError, match=r"^partitions: expected a non-empty mapping"):
        score_partitions(x, {}, models)
    with pytest.raises(ValueError, match=r"^fine_to_client: expected 1 entries"):
        kernel_sums(
            x, np.zeros(len(x), int), models.values(), make_kernel("poly", None, x.shape[1])
        ).coarsen(np.array([0, 1]))


def test_small_blocks_give_the_same_scores(monkeypatch):
    """Blocks smaller than the pool and the models (PRDC distance blocks of 256 rows,
    FD sums over 50 rows, KD kernel and one-hot blocks of 64 rows): the values of
    scoring each partition afresh."""
    from distrank import _arrays
    from distrank.metrics.fd import _partitions as partitions

    monkeypatch.setattr(_arrays, "BLOCK_ELEMENTS", 2**17)  # 256 rows a block
    monkeypatch.setattr(partitions, "_FD_BLOCK", 50)
    rng = np.random.default_rng(1)
    n, d = 560, 6
    labels = np.repeat(np.arange(4), 140)
    x = rng.standard_normal((n, d)) + 1.5 * rng.standard_normal((4, d))[labels]
    models = {f"g{i}": (0.5 + 0.4 * i) * rng.standard_normal((270 + 40 * i, d)) for i in range(2)}
    partitions = {"by_class": labels, "mod3": (np.arange(n) // 10) % 3, "pool": np.zeros(n, int)}
    table = score_partitions(x, partitions, models, dtype="float64", block_size=64)
    for name, clients in partitions.items():
        got = table[table.partition == name].drop(columns="partition").reset_index(drop=True)
        want = score(x, clients, models, dtype="float64", block_size=64)
        _compare(got, want, kd_rtol=1e-12, fd_rtol=1e-10)
