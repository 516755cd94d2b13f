"""`distrank score`: the CSV it writes, what it prints, and the errors that leave no file."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from distrank.cli import main
from distrank.metrics import score

RNG = np.random.default_rng(7)
D = 4


@pytest.fixture
def files(tmp_path):
    clients = np.array(["north", "south", "east"])[RNG.integers(0, 3, size=90)]
    x = RNG.normal(size=(90, D)) + (clients == "south")[:, None] * 2.0
    models = {"good": RNG.normal(0.5, 1.2, size=(60, D)),
              "bad": RNG.normal(3.0, 0.3, size=(50, D)),
              "odd": RNG.normal(-1.0, 2.0, size=(40, D))}
    np.savez(tmp_path / "ref.npz", features=x.astype(np.float32), clients=clients)
    for name, y in models.items():
        np.savez(tmp_path / f"{name}.npz", features=y.astype(np.float32))
    return tmp_path


def model_args(path, names=("good", "bad", "odd")):
    return [a for n in names for a in ("--model", f"{n}={path / (n + '.npz')}")]


def test_score_writes_the_tidy_table_and_prints_a_summary(files, capsys):
    out = files / "out" / "scores.csv"
    status = main(["score", "--reference", str(files / "ref.npz"), *model_args(files),
                   "--dtype", "float64", "--out", str(out)])
    assert status == 0
    table = pd.read_csv(out, keep_default_na=False)
    assert list(table.columns) == ["model", "metric", "aggregation", "client", "value"]
    with np.load(files / "ref.npz") as ref:
        models = {n: np.load(files / f"{n}.npz")["features"] for n in ("good", "bad", "odd")}
        expected = score(ref["features"], ref["clients"], models, dtype="float64")
    pd.testing.assert_frame_equal(table, expected, check_exact=False, rtol=1e-12)
    printed = capsys.readouterr().out
    assert "Kendall tau" in printed
    assert "kd" in printed and "coverage" in printed
    assert "+1.000" in printed  # KD ranks the models the same way in both aggregations


def test_score_options_reach_the_metrics(files):
    out = files / "scores.csv"
    status = main(["score", "--reference", str(files / "ref.npz"), *model_args(files),
                   "--metric", "kd", "recall", "--kernel", "rbf", "--kernel-param",
                   "bandwidth=1.5", "--kd-estimator", "biased", "--weights", "uniform",
                   "--pr-k", "2", "--dtype", "float64", "--out", str(out)])
    assert status == 0
    table = pd.read_csv(out, keep_default_na=False)
    with np.load(files / "ref.npz") as ref:
        models = {n: np.load(files / f"{n}.npz")["features"] for n in ("good", "bad", "odd")}
        expected = score(ref["features"], ref["clients"], models, metrics=["kd", "recall"],
                         kernel="rbf", kernel_params={"bandwidth": 1.5}, kd_estimator="biased",
                         weights="uniform", pr_k=2, dtype="float64")
    pd.testing.assert_frame_equal(table, expected, check_exact=False, rtol=1e-12)


def broken(files, kind):
    """Write one bad input; return (arguments, text the error must contain)."""
    ref, good = files / "ref.npz", files / "good.npz"
    x = np.load(ref)["features"]
    if kind == "missing clients":
        np.savez(ref, features=x)
        return [], [str(ref), "'clients'"]
    if kind == "nan model":
        y = np.load(good)["features"]
        y[3, 1] = np.nan
        np.savez(good, features=y)
        return [], [str(good), "NaN"]
    if kind == "dimension":
        np.savez(good, features=np.zeros((10, D + 2), np.float32))
        return [], [str(good), "dimension 6", "4"]
    if kind == "empty model":
        np.savez(good, features=np.zeros((0, D), np.float32))
        return [], [str(good), "non-empty"]
    if kind == "missing file":
        good.unlink()
        return [], [str(good), "no such file"]
    if kind == "small client":
        clients = np.load(ref)["clients"]
        clients[:2] = "tiny"
        np.savez(ref, features=x, clients=clients)
        return ["--pr-k", "3"], [str(ref), "client 'tiny' has 2 rows"]
    if kind == "clients length":
        np.savez(ref, features=x, clients=np.zeros(len(x) - 1, dtype=int))
        return [], [str(ref), "'clients' has shape"]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["missing clients", "nan model", "dimension", "empty model",
                                  "missing file", "small client", "clients length"])
def test_bad_input_names_the_file_and_leaves_no_output(files, capsys, kind):
    extra, expected = broken(files, kind)
    out = files / "scores.csv"
    status = main(["score", "--reference", str(files / "ref.npz"), *model_args(files),
                   *extra, "--out", str(out)])
    assert status == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err
    assert list(files.glob("*.csv")) == [] and list(files.glob(".scores*")) == []


def test_bad_model_spec_is_a_usage_error(files, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["score", "--reference", str(files / "ref.npz"), "--model", "nopath",
              "--out", str(files / "s.csv")])
    assert exit_.value.code == 2
    assert "expected NAME=PATH.npz" in capsys.readouterr().err


def test_python_dash_m_distrank_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "distrank", "score", "--help"],
                          capture_output=True, text=True, check=True)
    assert "--reference" in done.stdout and "--kd-estimator" in done.stdout
