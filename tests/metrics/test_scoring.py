"""The score table: layout, aggregations, PRDC wiring, client scores and input checks."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from prdc import compute_prdc

from distrank.metrics import client_scores, score

RNG = np.random.default_rng(2310)
D = 5


@pytest.fixture(scope="module")
def federation():
    clients = np.array(["paris", "oslo", "rome"])[RNG.integers(0, 3, size=240)]
    offsets = {"paris": 0.0, "oslo": 1.5, "rome": -1.0}
    x = RNG.normal(size=(240, D)) + np.array([offsets[c] for c in clients])[:, None]
    models = {
        "sharp": RNG.normal(0.2, 1.0, size=(120, D)),
        "blurry": RNG.normal(0.0, 0.5, size=(90, D)),
        "broad": RNG.normal(0.0, 2.0, size=(100, D)),
    }
    return x, clients, models


@pytest.fixture(scope="module")
def table(federation):
    x, clients, models = federation
    return score(x, clients, models, dtype="float64")


def test_table_layout(table, federation):
    _, clients, models = federation
    assert list(table.columns) == ["model", "metric", "aggregation", "client", "value"]
    assert set(table.model) == set(models)
    assert set(table.metric) == {"kd", "fd", "precision", "recall", "density", "coverage"}
    assert set(table.aggregation) == {"all", "avg", "client"}
    assert set(table[table.aggregation == "client"].client) == {"oslo", "paris", "rome"}
    assert (table[table.aggregation != "client"].client == "").all()
    assert len(table) == 3 * 6 * (2 + 3)
    assert np.isfinite(table.value).all()


@pytest.mark.parametrize("weights", ["size", "uniform"])
def test_avg_is_the_weighted_client_average(federation, weights):
    x, clients, models = federation
    table = score(x, clients, models, weights=weights, dtype="float64")
    names, sizes = np.unique(clients, return_counts=True)
    lam = sizes / sizes.sum() if weights == "size" else np.full(3, 1 / 3)
    rows = table.set_index(["model", "metric", "aggregation", "client"]).value
    for model in models:
        for metric in ("kd", "fd", "precision", "recall", "density", "coverage"):
            local = [rows[model, metric, "client", c] for c in names]
            assert rows[model, metric, "avg", ""] == pytest.approx(lam @ local, rel=1e-12)


def test_recall_all_is_the_size_weighted_average_of_client_recalls(table):
    recall = table[table.metric == "recall"].set_index(["model", "aggregation"]).value
    for model in table.model.unique():
        assert recall[model, "avg"] == pytest.approx(recall[model, "all"], rel=1e-12)
    # and precision, whose radii depend on the clients, has no such identity here
    precision = table[table.metric == "precision"].set_index(["model", "aggregation"]).value
    assert any(
        precision[m, "avg"] != pytest.approx(precision[m, "all"], rel=1e-6)
        for m in table.model.unique()
    )


def test_prdc_all_equals_the_prdc_package(federation, capsys):
    x, clients, models = federation
    table = score(
        x,
        clients,
        models,
        metrics=["precision", "recall", "density", "coverage"],
        pr_k=4,
        dc_k=4,
        dtype="float64",
    )
    rows = table.set_index(["model", "metric", "aggregation", "client"]).value
    for model, y in models.items():
        expected = compute_prdc(x, y, nearest_k=4)
        for metric, value in expected.items():
            assert rows[model, metric, "all", ""] == pytest.approx(value, rel=1e-12)
        xc = x[clients == "rome"]
        expected = compute_prdc(xc, y, nearest_k=4)
        for metric, value in expected.items():
            assert rows[model, metric, "client", "rome"] == pytest.approx(value, rel=1e-12)


def test_torch_input_gives_the_numpy_result(federation, table):
    x, clients, models = federation
    as_torch = score(
        torch.from_numpy(x),
        clients,
        {k: torch.from_numpy(v) for k, v in models.items()},
        dtype="float64",
    )
    np.testing.assert_allclose(as_torch.value, table.value, rtol=1e-12)


def test_float32_default_is_close_to_float64(federation, table):
    x, clients, models = federation
    f32 = score(
        x.astype(np.float32),
        clients,
        {k: v.astype(np.float32) for k, v in models.items()},
        metrics=["kd", "fd"],
    )
    f64 = table[table.metric.isin(["kd", "fd"])]
    np.testing.assert_allclose(f32.value, f64.value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel,params", [("poly", None), ("rbf", {"bandwidth": 2.0})])
def test_client_scores_equal_the_client_rows(federation, kernel, params):
    x, clients, models = federation
    table = score(x, clients, models, kernel=kernel, kernel_params=params, dtype="float64")
    rows = table.set_index(["model", "metric", "aggregation", "client"]).value
    got = client_scores(
        x[clients == "oslo"], models["broad"], kernel=kernel, kernel_params=params, dtype="float64"
    )
    assert set(got) == {"kd", "fd", "precision", "recall", "density", "coverage"}
    for metric, value in got.items():
        assert value == pytest.approx(rows["broad", metric, "client", "oslo"], rel=1e-10)


def test_client_scores_need_an_explicit_bandwidth(federation):
    x, clients, models = federation
    with pytest.raises(ValueError, match="kernel_params: kernel 'rbf' needs an explicit"):
        client_scores(x, models["sharp"], metrics=["kd"], kernel="rbf")


def test_subsets_mode_adds_kd_std(federation):
    x, clients, models = federation
    table = score(
        x,
        clients,
        {"sharp": models["sharp"]},
        metrics=["kd"],
        kd_estimator="subsets",
        n_subsets=3,
        subset_size=50,
        dtype="float64",
    )
    std = table[table.metric == "kd_std"]
    assert set(std.aggregation) == {"all", "client"}
    assert (std.value >= 0).all()
    assert set(
        client_scores(
            x, models["sharp"], metrics=["kd"], kd_estimator="subsets", n_subsets=2, subset_size=50
        )
    ) == {"kd", "kd_std"}


@pytest.mark.parametrize(
    "change,match",
    [
        ({"metrics": ["kd", "fid"]}, "metrics: expected a non-empty subset"),
        ({"clients": np.zeros(7)}, r"clients: expected 240 labels"),
        ({"weights": "equal"}, r"weights: expected one of \('size', 'uniform'\)"),
        ({"dtype": "float16"}, "dtype: expected one of"),
        ({"models": {}}, "models: expected a non-empty mapping"),
        ({"models": {"g": np.zeros((0, D))}}, r"models\['g'\]: empty array"),
        ({"models": {"g": np.full((10, D), np.inf)}}, r"models\['g'\]: contains NaN or infinite"),
        ({"models": {"g": np.zeros((10, D + 1))}}, r"models\['g'\]: dimension 6 does not match"),
        ({"reference": np.full((240, D), np.nan)}, "reference: contains NaN"),
        ({"pr_k": 0}, "pr_k: expected an integer >= 1"),
        (
            {"models": {"g": np.ones((3, D))}, "metrics": ["recall"]},
            r"models\['g'\] has 3 rows; k=3 nearest neighbours needs at least 4",
        ),
    ],
)
def test_bad_input_is_named(federation, change, match):
    x, clients, models = federation
    args = {"reference": x, "clients": clients, "models": models} | change
    reference, clients, models = args.pop("reference"), args.pop("clients"), args.pop("models")
    with pytest.raises(ValueError, match=match):
        score(reference, clients, models, **args)


def test_prdc_needs_k_plus_one_rows_per_client():
    x = RNG.normal(size=(10, 2))
    clients = np.repeat([0, 1], [7, 3])
    with pytest.raises(ValueError, match=r"client '1' has 3 rows; k=5 nearest neighbours"):
        score(x, clients, {"g": RNG.normal(size=(8, 2))}, metrics=["coverage"])


@pytest.mark.parametrize(
    "change,subject",
    [
        ({"reference": np.full((240, D), np.nan)}, ("reference", None)),
        ({"clients": np.zeros(7)}, ("reference", None)),
        ({"models": {"g": np.zeros((10, D + 1))}}, ("model", "g")),
        ({"models": {"g": np.ones((3, D))}, "metrics": ["recall"]}, ("model", "g")),
        ({"models": {"g": np.ones((1, D))}, "metrics": ["kd"]}, ("model", "g")),
    ],
)
def test_bad_input_carries_its_subject(federation, change, subject):
    """The error says which input it is about as data (InputError.subject), so a caller
    that read the input from a file names the file without parsing the message."""
    from distrank._checks import InputError

    x, clients, models = federation
    args = {"reference": x, "clients": clients, "models": models} | change
    reference, clients, models = args.pop("reference"), args.pop("clients"), args.pop("models")
    with pytest.raises(InputError) as err:
        score(reference, clients, models, **args)
    assert err.value.subject == subject
    assert str(err.value.at("/data/x.npz")) == f"/data/x.npz: {err.value}"


def test_a_small_client_is_the_subject_of_its_error():
    from distrank._checks import InputError

    x = RNG.normal(size=(10, 2))
    with pytest.raises(InputError) as err:
        score(
            x, np.repeat(["a", "b"], [7, 3]), {"g": RNG.normal(size=(8, 2))}, metrics=["coverage"]
        )
    assert err.value.subject == ("client", "b")
    with pytest.raises(ValueError) as err:  # an option is no input
        score(x, np.repeat(["a", "b"], [7, 3]), {"g": RNG.normal(size=(8, 2))}, pr_k=0)
    assert not isinstance(err.value, InputError)


def test_fd_in_chunks_of_models_and_clients_gives_the_same_values(monkeypatch):
    """One model and one client at a time (the smallest chunks) and all at once agree
    bit for bit: memory, not the arithmetic, changes (client 0 has fewer rows than
    features: its rows are held, the others' covariances)."""
    from distrank.metrics import _scoring as scoring
    from distrank.metrics.fd import _family as fd_family

    rng = np.random.default_rng(4)
    x, labels = rng.standard_normal((90, 5)), np.repeat([0, 1, 2], [4, 40, 46])
    models = {f"m{i}": rng.standard_normal((40, 5)) + i for i in range(3)}
    whole = scoring.score(x, labels, models, metrics=["fd"], dtype="float64")
    monkeypatch.setattr(fd_family, "FD_CHUNK_BYTES", 1)
    chunked = scoring.score(x, labels, models, metrics=["fd"], dtype="float64")
    assert chunked["value"].tolist() == whole["value"].tolist()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "kernel,params", [("poly", None), ("rbf", {"bandwidth": 2.0}), ("laplace", None)]
)
def test_kd_from_prdcs_products_is_kd_from_its_own(federation, monkeypatch, dtype, kernel, params):
    """With PRDC in the call, KD's sums come from PRDC's products (kernel_sums is not
    called), and every value is bit for bit that of scoring the families apart."""
    from distrank.metrics.kd import _sums as kd

    x, clients, models = federation
    opts = {"kernel": kernel, "kernel_params": params, "dtype": dtype, "block_size": 64}
    apart = pd.concat(
        [
            score(x, clients, models, metrics=[m], **opts)
            for m in ("kd", "precision", "recall", "density", "coverage")
        ]
    )
    monkeypatch.setattr(kd, "kernel_sums", None)
    shared = score(
        x, clients, models, metrics=["kd", "precision", "recall", "density", "coverage"], **opts
    )
    key = ["model", "metric", "aggregation", "client"]
    pd.testing.assert_frame_equal(
        shared.sort_values(key).reset_index(drop=True),
        apart.sort_values(key).reset_index(drop=True),
    )
    assert (shared.metric == "kd").sum() == 3 * (2 + 3)


@pytest.mark.parametrize(
    "options",
    [
        {"dtype": "float64"},
        {"kernel": "rbf", "kernel_params": {"bandwidth": 2.0}},
        {"metrics": ["precision", "density", "fd"], "pr_k": 2},
        {"metrics": ["kd", "fd"], "kd_estimator": "subsets", "n_subsets": 5, "subset_size": 20},
    ],
)
def test_the_pooled_values_alone_are_the_all_rows_bit_for_bit(federation, options, monkeypatch):
    """``pooled_of`` (a client's scores, the pipeline's centralized ``all``) asks the families
    for their pooled values only -- FD computes no client distance, PRDC no client radius --
    and gets the ``all`` rows of the whole table exactly, with no table built."""
    from distrank.metrics import _scoring as scoring
    from distrank.metrics._options import score_options
    from distrank.metrics.fd import _frechet as frechet

    x, clients, models = federation
    inputs = scoring.prepare(x, clients, models, score_options(options))
    table = scoring.table_of(inputs)
    rows = table[table.aggregation == "all"]
    expected = {g: dict(zip(part.metric, part.value)) for g, part in rows.groupby("model")}
    fds = []
    original = frechet.frechet_distances
    monkeypatch.setattr(
        frechet,
        "frechet_distances",
        lambda a, *args, **kw: fds.append(len(a)) or original(a, *args, **kw),
    )
    monkeypatch.setattr(scoring, "from_values", None)  # no table
    assert scoring.pooled_of(inputs) == expected
    assert fds == ([1] if "fd" in inputs.options.metrics else [])  # the pool's, none per client
    local = scoring.values_of(replace(inputs, per_client=False))
    for by_metric in local.values():
        for metric, (_, per_client) in by_metric.items():
            assert (per_client is None) == (metric != "kd" and metric != "kd_std"), metric


def test_score_client_normalises_its_options_once_and_builds_no_table(federation, monkeypatch):
    from distrank.metrics import _options as options_module
    from distrank.metrics import _scoring as scoring

    x, clients, models = federation
    expected = client_scores(x[clients == "rome"], models["sharp"], dtype="float64")
    calls = []
    normalise = options_module.score_options
    monkeypatch.setattr(
        scoring, "score_options", lambda *a, **k: calls.append(1) or normalise(*a, **k)
    )
    monkeypatch.setattr(scoring, "from_values", None)
    assert client_scores(x[clients == "rome"], models["sharp"], dtype="float64") == expected
    assert calls == [1]
