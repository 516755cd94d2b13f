"""E10: adjacent pairs and their margins from a hand-made pair table; the bootstrap
tables of a small study (KD's tau interval is exactly [1, 1] by Theorem 1)."""

import re

import numpy as np
import pandas as pd
import pytest
from experiments_testkit import clustered_clients

from distrank.clients import save_manifest
from distrank.experiments import Outputs
from distrank.experiments.e10_intervals import (
    TABLES,
    bootstrap_tables,
    check,
    e10_figure,
    e10_table,
    run,
    write_bootstrap_tables,
)
from distrank.metrics import score

RNG = np.random.default_rng(10)


def pair_rows(metric, scores, intervals):
    """A pairs table (both orientations mixed) from scores and difference intervals."""
    rows = []
    names = list(scores)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            low, high = intervals[(a, b)]
            rows.append(
                (
                    metric,
                    "avg",
                    a,
                    b,
                    scores[a],
                    scores[b],
                    scores[a] - scores[b],
                    low,
                    high,
                    100,
                    0.95,
                )
            )
    return rows


def test_adjacent_pairs_margins_and_separation():
    kd = {"c": 0.5, "a": 0.1, "b": 0.3}  # lower is better: a, b, c
    kd_iv = {("c", "a"): (0.2, 0.6), ("c", "b"): (-0.1, 0.5), ("a", "b"): (-0.3, -0.1)}
    prec = {"a": 0.2, "b": 0.9, "c": 0.6}  # higher is better: b, c, a
    prec_iv = {("a", "b"): (-0.8, -0.6), ("a", "c"): (-0.5, -0.3), ("b", "c"): (-0.05, 0.6)}
    pairs = pd.DataFrame(
        pair_rows("kd", kd, kd_iv) + pair_rows("precision", prec, prec_iv),
        columns=[
            "metric",
            "aggregation",
            "model_a",
            "model_b",
            "score_a",
            "score_b",
            "difference",
            "low",
            "high",
            "n_resamples",
            "confidence_level",
        ],
    )
    table = e10_table(pairs).set_index(["metric", "rank"])
    assert list(table.loc["KD"][["better", "worse"]].itertuples(index=False)) == [
        ("a", "b"),
        ("b", "c"),
    ]
    assert table.loc[("KD", 1), "margin"] == pytest.approx(0.2)
    assert (table.loc[("KD", 1), "low"], table.loc[("KD", 1), "high"]) == (0.1, 0.3)
    assert (table.loc[("KD", 2), "low"], table.loc[("KD", 2), "high"]) == (-0.1, 0.5)
    assert table.loc[("KD", 1), "separated"] and not table.loc[("KD", 2), "separated"]
    assert list(table.loc["Precision"][["better", "worse"]].itertuples(index=False)) == [
        ("b", "c"),
        ("c", "a"),
    ]
    assert table.loc[("Precision", 1), "margin"] == pytest.approx(0.3)
    assert (table.loc[("Precision", 1), "low"], table.loc[("Precision", 1), "high"]) == (-0.05, 0.6)
    assert (table.loc[("Precision", 2), "low"], table.loc[("Precision", 2), "high"]) == (0.3, 0.5)
    assert list(table.separated) == [True, False, False, True]


@pytest.fixture(scope="module")
def small_study():
    x, owner, _ = clustered_clients(np.random.default_rng(3), k=3, d=3, sizes=[25, 30, 35])
    models = {
        f"m{i}": np.random.default_rng(i).normal(0.3 * i, 1 + 0.3 * i, size=(30, 3))
        for i in range(4)
    }
    return x, owner, models


def test_bootstrap_tables_of_a_small_study(small_study):
    x, owner, models = small_study
    metrics = ["kd", "fd", "precision", "coverage"]
    pairs, tau = bootstrap_tables(
        x,
        owner,
        models,
        metrics=metrics,
        n_resamples={"kd": 200, "fd": 4, "prdc": 3},
        confidence_level=0.9,
        seed=1,
        kernel="poly",
        kd_estimator="unbiased",
        weights="size",
        pr_k=3,
        dc_k=3,
        dtype="float64",
    )
    assert list(tau.metric) == metrics
    assert list(tau.n_resamples) == [200, 4, 3, 3]
    kd = tau.set_index("metric").loc["kd"]
    assert (kd.kendall_tau, kd.low, kd.high) == (1.0, 1.0, 1.0)
    assert len(pairs) == len(metrics) * 2 * 6
    exact = score(x, owner, models, metrics=metrics, pr_k=3, dc_k=3, dtype="float64")
    value = exact.set_index(["metric", "model", "aggregation"]).value
    for row in pairs.itertuples():
        assert row.score_a == value[(row.metric, row.model_a, row.aggregation)]
        assert row.difference == pytest.approx(row.score_a - row.score_b, abs=1e-15)
    kd_pairs = pairs[pairs.metric == "kd"]
    avg, pooled = kd_pairs[kd_pairs.aggregation == "avg"], kd_pairs[kd_pairs.aggregation == "all"]
    np.testing.assert_allclose(avg.low.to_numpy(), pooled.low.to_numpy(), rtol=1e-9)
    table = e10_table(pairs)
    assert len(table) == len(metrics) * 3 and (table.margin >= 0).all()
    assert (table.confidence_level == 0.9).all()


def test_figure_has_a_panel_per_metric(small_study, tmp_path):
    x, owner, models = small_study
    pairs, tau = bootstrap_tables(
        x,
        owner,
        models,
        metrics=["kd", "fd", "precision"],
        n_resamples={"kd": 50, "fd": 3, "prdc": 3},
        confidence_level=0.95,
        seed=0,
        kernel="poly",
        kd_estimator="biased",
        weights="size",
        pr_k=3,
        dc_k=3,
        dtype="float64",
    )
    table = e10_table(pairs)
    fig = e10_figure(table, tau.assign(metric=["KD", "FD", "Precision"]), "efficientnet_lite0")
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 3
    for ax, name in zip(visible, ["KD", "FD", "Precision"]):
        title = ax.get_title(loc="left")
        assert re.match(rf"\([abc]\) {name}: \d+/\d+ separated, \$\\tau\$ = ", title), title
        assert ax.get_xlabel()
        assert len(ax.get_yticklabels()) == 3
    fig.savefig(tmp_path / "e10.png")


def test_check_names_the_key():
    with pytest.raises(
        ValueError,
        match=r"^config: experiments\.E10 bootstraps KD: metrics\.kd_estimator: expected "
        r"'unbiased' or 'biased' \(bootstrap KD re-weights the full samples\), got 'subsets'$",
    ):
        check({"metrics": ["kd"]}, {"metrics": {"kd_estimator": "subsets"}})
    check({"metrics": ["fd"]}, {"metrics": {"kd_estimator": "subsets"}})


def test_files_to_outputs(small_study, tmp_path):
    x, owner, models = small_study
    np.savez(tmp_path / "reference.npz", features=x)
    save_manifest(tmp_path / "manifest.csv", owner)
    paths = {}
    for name, y in models.items():
        paths[name] = tmp_path / f"model_{name}.npz"
        np.savez(paths[name], features=y)
    metrics_config = {
        "kernel": "poly",
        "kd_estimator": "unbiased",
        "weights": "size",
        "pr_k": 3,
        "dc_k": 3,
        "dtype": "float64",
    }
    write_bootstrap_tables(
        tmp_path / "reference.npz",
        tmp_path / "manifest.csv",
        paths,
        tmp_path / "pairs.csv",
        tmp_path / "tau.csv",
        metrics=["kd", "fd"],
        n_resamples={"kd": 30, "fd": 2, "prdc": 2},
        confidence_level=0.95,
        seed=0,
        metrics_config=metrics_config,
    )
    pairs = pd.read_csv(tmp_path / "pairs.csv")
    assert set(pairs.metric) == {"kd", "fd"}
    out = run(
        {"pairs": str(tmp_path / "pairs.csv"), "tau": str(tmp_path / "tau.csv")},
        {},
        {"extractor": "efficientnet_lite0"},
    )
    assert isinstance(out, Outputs) and set(out.tables) == set(TABLES)
    assert list(out.tables["_tau"].metric) == ["KD", "FD"]
