"""`distrank score --private EPSILON --delta DELTA` and `--intervals N`: the table equals
the library's (private_scores, bootstrap_scores) on the same inputs and seed; the budget
and the interval method are recorded in the metadata; misuse is an input error."""

import json

import numpy as np
import pandas as pd
import pytest
from textkit import cli_error

from distrank.cli import EXIT_INPUT, main
from distrank.metrics.bootstrap import bootstrap_scores, flat_summary, score_intervals
from distrank.metrics.privacy import private_scores

RNG = np.random.default_rng(13)
D = 3
MODELS = ("good", "bad", "odd")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def files(tmp_path):
    clients = np.repeat(["north", "south", "east"], [25, 30, 35])
    x = RNG.normal(size=(90, D)) + (clients == "south")[:, None] * 2.0
    models = {
        "good": RNG.normal(0.5, 1.2, size=(40, D)),
        "bad": RNG.normal(3.0, 0.3, size=(30, D)),
        "odd": RNG.normal(-1.0, 2.0, size=(35, D)),
    }
    np.savez(tmp_path / "ref.npz", features=x, clients=clients)
    for name, y in models.items():
        np.savez(tmp_path / f"{name}.npz", features=y)
    return tmp_path


def inputs(path):
    with np.load(path / "ref.npz") as ref:
        x, clients = ref["features"], ref["clients"]
    return x, clients, {n: np.load(path / f"{n}.npz")["features"] for n in MODELS}


def score_args(path, *extra):
    models = [a for n in MODELS for a in ("--model", f"{n}={path / (n + '.npz')}")]
    return ["score", "--reference", str(path / "ref.npz"), *models, "--dtype", "float64", *extra]


def test_private_scores_equal_the_library_and_record_the_budget(files, capsys):
    out = files / "private.csv"
    status = main(
        score_args(
            files,
            "--metric",
            "kd",
            "--kernel",
            "rbf",
            "--kernel-param",
            "bandwidth=1.5",
            "--private",
            "1.0",
            "--delta",
            "1e-5",
            "--seed",
            "4",
            "--out",
            str(out),
        )
    )
    assert status == 0
    table = pd.read_csv(out, keep_default_na=False)
    x, clients, models = inputs(files)
    expected, budget = private_scores(
        x,
        clients,
        models,
        epsilon=1.0,
        delta=1e-5,
        kernel_params={"bandwidth": 1.5},
        seed=4,
        dtype="float64",
    )
    pd.testing.assert_frame_equal(table, expected, check_exact=False, rtol=1e-12)
    assert set(table.aggregation) == {"avg", "client"}
    meta = json.loads((files / "private.csv.meta.json").read_text())
    privacy = meta["privacy"]
    assert privacy["epsilon"] == 1.0 and privacy["delta"] == 1e-5
    assert privacy["n_releases"] == 3
    assert privacy["epsilon_spent"] == pytest.approx(budget.epsilon_spent, rel=1e-12)
    assert privacy["noise_multiplier"] == pytest.approx(budget.noise_multiplier, rel=1e-12)
    assert "epsilon" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            (
                "--metric",
                "kd",
                "--kernel",
                "rbf",
                "--kernel-param",
                "bandwidth=1",
                "--private",
                "1",
            ),
            "--delta",
        ),
        (
            (
                "--kernel",
                "rbf",
                "--kernel-param",
                "bandwidth=1",
                "--private",
                "1",
                "--delta",
                "1e-5",
            ),
            "--metric kd",
        ),
        (("--metric", "kd", "--private", "1", "--delta", "1e-5"), "kernel"),
        (("--metric", "kd", "--kernel", "rbf", "--private", "1", "--delta", "1e-5"), "bandwidth"),
        (
            (
                "--metric",
                "kd",
                "--kernel",
                "rbf",
                "--kernel-param",
                "bandwidth=1",
                "--private",
                "0",
                "--delta",
                "1e-5",
            ),
            "epsilon",
        ),
        (
            (
                "--metric",
                "kd",
                "--kernel",
                "rbf",
                "--kernel-param",
                "bandwidth=1",
                "--private",
                "1",
                "--delta",
                "1e-5",
                "--intervals",
                "10",
            ),
            "--intervals",
        ),
        (
            (
                "--metric",
                "kd",
                "--kd-estimator",
                "subsets",
                "--subset-size",
                "10",
                "--n-subsets",
                "2",
                "--intervals",
                "10",
            ),
            "kd_estimator",
        ),
    ],
)
def test_misuse_is_an_input_error_and_writes_nothing(files, capsys, extra, message):
    out = files / "bad.csv"
    assert main(score_args(files, *extra, "--out", str(out))) == EXIT_INPUT
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_intervals_add_low_and_high_from_the_bootstrap(files):
    out = files / "intervals.csv"
    status = main(
        score_args(
            files, "--metric", "kd", "fd", "--intervals", "40", "--seed", "2", "--out", str(out)
        )
    )
    assert status == 0
    table = pd.read_csv(out, keep_default_na=False)
    assert list(table.columns) == [
        "model",
        "metric",
        "aggregation",
        "client",
        "value",
        "low",
        "high",
    ]
    x, clients, models = inputs(files)
    result = bootstrap_scores(
        x,
        clients,
        models,
        summary=flat_summary,
        metrics=("kd", "fd"),
        n_resamples=40,
        seed=2,
        dtype="float64",
    )
    expected = score_intervals(result)
    keys = ["model", "metric", "aggregation", "client"]
    merged = table.merge(expected, on=keys, suffixes=("", "_lib"))
    assert len(merged) == len(table) == len(expected)
    for column in ("value", "low", "high"):
        np.testing.assert_allclose(merged[column], merged[f"{column}_lib"], rtol=1e-12)
    assert (table.low <= table.high).all()
    meta = json.loads((files / "intervals.csv.meta.json").read_text())
    assert meta["intervals"]["n_resamples"] == 40
    assert meta["intervals"]["confidence_level"] == 0.95
    assert "percentile" in meta["intervals"]["method"]


@pytest.mark.parametrize("epsilon", ["0", "-1", "9e-4", "2e9", "nan", "inf"])
def test_private_epsilon_outside_its_range_is_an_input_error(files, capsys, epsilon):
    out = files / "bad.csv"
    private = ("--metric", "kd", "--kernel", "rbf", "--kernel-param", "bandwidth=1")
    args = score_args(files, *private, "--private", epsilon, "--delta", "1e-5", "--out", str(out))
    assert main(args) == EXIT_INPUT
    message = cli_error(capsys.readouterr().err, "score")
    assert message.startswith("--private: expected an epsilon in [0.001, 1e+09], got ")
    assert not out.exists()
