"""E8: heterogeneity sweep against rank agreement (distrank.experiments.e8_heterogeneity)."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from distrank import experiments
from distrank.clients import partition
from distrank.experiments.e8_heterogeneity import (
    ONE_CLASS,
    block_index,
    draw_partitions,
    e8_heatmap,
    e8_index_figure,
    e8_table,
    partition_agreement,
)
from distrank.metrics._reaggregate import score_partitions

SETTINGS = {
    "n_clients": 5,
    "alphas": [1000, 1, 0.1],
    "one_class": True,
    "seeds": 3,
    "block_rows": 5,
    "min_rows": 10,
}

CONTEXT = {  # what the pipeline passes run(): the default study's metric options
    "extractor": "efficientnet_lite0",
    "seed": 0,
    "models": [],
    "metrics": {
        "kernel": "poly",
        "kd_estimator": "unbiased",
        "weights": "size",
        "pr_k": 3,
        "dc_k": 5,
        "dtype": "float64",
    },
}


@pytest.fixture(scope="module")
def pool():
    """Ten well separated classes of 60 rows in 8-d, and eight models of varied spread."""
    rng = np.random.default_rng(0)
    means = 3.0 * rng.standard_normal((10, 8))
    labels = np.repeat(np.arange(10), 60)
    x = means[labels] + rng.standard_normal((len(labels), 8))
    models = {}
    for i in range(8):
        c = rng.integers(0, 10, 200)
        models[f"g{i}"] = (
            (1 - 0.1 * i) * means[c] + 0.2 * i + (0.3 + 0.25 * i) * rng.standard_normal((200, 8))
        )
    return x, labels, models


@pytest.fixture(scope="module")
def sweep(pool):
    x, labels, models = pool
    parts, meta = draw_partitions(labels, **SETTINGS, seed=0)
    scores = score_partitions(x, parts, models, dtype="float64")
    return parts, meta, scores, partition_agreement(scores, meta)


def test_blocks_hold_one_class_and_about_block_rows_rows():
    labels = np.repeat([0, 1, 2], [23, 10, 7])
    block, block_labels = block_index(labels, block_rows=5, seed=0)
    sizes = np.bincount(block)
    assert len(sizes) == 5 + 2 + 2 and sizes.min() >= 3 and sizes.max() <= 5
    assert np.array_equal(block_labels[block], labels)
    again, _ = block_index(labels, block_rows=5, seed=0)
    assert np.array_equal(block, again)
    with pytest.raises(ValueError, match=r"^block_rows: expected an int >= 1"):
        block_index(labels, block_rows=0, seed=0)


def test_partitions_are_block_dirichlet_draws_and_the_one_class_limit(pool, sweep):
    _, labels, _ = pool
    parts, meta, _, _ = sweep
    assert len(parts) == (len(SETTINGS["alphas"]) + 1) * SETTINGS["seeds"]
    assert list(meta["setting"].unique()) == ["alpha=1000", "alpha=1", "alpha=0.1", ONE_CLASS]
    block, block_labels = block_index(labels, block_rows=5, seed=0)
    for _, row in meta.iterrows():
        clients = parts[row["partition"]]
        # constant on every block, so the blocks refine every partition
        assert all(len(np.unique(clients[block == b])) == 1 for b in range(block.max() + 1))
        if row["setting"] == ONE_CLASS:
            assert np.array_equal(clients, labels)  # classes 0..9 -> clients 0..9
        else:
            scheme = {"kind": "dirichlet", "n_clients": 5, "alpha": row["alpha"], "min_rows": 2}
            want = partition(block_labels, scheme=scheme, seed=int(row["seed"]))[block]
            assert np.array_equal(clients, want)
            assert np.bincount(clients, minlength=5).min() >= SETTINGS["min_rows"]


def test_kendall_tau_is_scipys_on_each_partition(sweep):
    _, meta, scores, per_partition = sweep
    for name in meta["partition"][::4]:
        rows = scores[(scores.partition == name) & (scores.aggregation != "client")]
        for metric, display in (("fd", "FD"), ("precision", "Precision")):
            wide = rows[rows.metric == metric].pivot(
                index="model", columns="aggregation", values="value"
            )
            want = stats.kendalltau(wide["avg"], wide["all"]).statistic
            got = per_partition[
                (per_partition.partition == name) & (per_partition.metric == display)
            ]["kendall_tau"].item()
            assert got == pytest.approx(want, abs=1e-15)


def test_kd_and_recall_agree_exactly_everywhere(sweep):
    """Theorem 1 and Recall's identity: tau = 1 at every setting and seed."""
    per_partition = sweep[3]
    for metric in ("KD", "Recall"):
        rows = per_partition[per_partition.metric == metric]
        assert len(rows) == 12 and (rows["rank_flips"] == 0).all(), metric
        np.testing.assert_allclose(rows["kendall_tau"], 1.0, rtol=0, atol=1e-12)
    # ... while FD does not at the one-class limit
    fd = per_partition[(per_partition.metric == "FD") & (per_partition.setting == ONE_CLASS)]
    assert (fd["kendall_tau"] < 0.5).all()


def test_heterogeneity_index_is_the_kd_gap_and_grows_as_alpha_falls(pool, sweep):
    x, _, _ = pool
    parts, meta, _, per_partition = sweep
    kd = per_partition[per_partition.metric == "KD"].set_index("partition")
    # the gap is the same for every model (Theorem 1) ...
    assert (kd["heterogeneity_spread"] <= 1e-9 * kd["heterogeneity"].abs().max()).all()
    # ... and equals sum_i lambda_i XX_i - XX_all of the U-statistic, from numpy alone
    d = x.shape[1]

    def within(rows):
        gram = (rows @ rows.T / d + 1.0) ** 3
        return (gram.sum() - np.trace(gram)) / (len(rows) * (len(rows) - 1))

    for name in meta["partition"][::3]:
        clients = parts[name]
        lam = np.bincount(clients) / len(clients)
        want = sum(w * within(x[clients == c]) for c, w in enumerate(lam)) - within(x)
        assert kd.loc[name, "heterogeneity"] == pytest.approx(want, rel=1e-10)
    table = e8_table(per_partition)
    index = table[table.metric == "KD"]["heterogeneity_mean"].to_numpy()
    assert list(table[table.metric == "KD"]["setting"]) == list(meta["setting"].unique())
    assert np.all(np.diff(index) > 0), index


def test_table_summarises_the_seeds(sweep):
    per_partition = sweep[3]
    table = e8_table(per_partition)
    assert len(table) == 4 * 6
    row = table[(table.setting == "alpha=1") & (table.metric == "FD")].iloc[0]
    seeds = per_partition[(per_partition.setting == "alpha=1") & (per_partition.metric == "FD")]
    assert row["tau_mean"] == pytest.approx(seeds["kendall_tau"].mean())
    assert (row["tau_min"], row["tau_max"]) == (
        seeds["kendall_tau"].min(),
        seeds["kendall_tau"].max(),
    )
    assert row["n_seeds"] == 3 and row["alpha"] == 1.0


def test_figures(sweep):
    per_partition = sweep[3]
    table = e8_table(per_partition)
    heat = e8_heatmap(table)
    ax = heat.axes[0]
    assert len(ax.texts) == 24 and ax.texts[0].get_text() == "1.00"
    assert [t.get_text() for t in ax.get_yticklabels()] == list(table["metric"].unique())
    index = e8_index_figure(per_partition, table, "efficientnet_lite0")
    ax = index.axes[0]
    assert "heterogeneity" in ax.get_xlabel() and "EfficientNet-Lite0" in ax.get_xlabel()
    assert len(ax.get_lines()) == 6


def test_run_reads_files_and_returns_the_declared_outputs(tmp_path, pool):
    x, labels, models = pool
    np.savez(tmp_path / "reference.npz", features=x.astype(np.float32), labels=labels)
    paths = []
    for name, y in list(models.items())[:5]:
        paths.append(tmp_path / f"model_{name}.npz")
        np.savez(paths[-1], features=y.astype(np.float32))
    settings = {**SETTINGS, "alphas": [10, 0.1], "seeds": 2}
    exp = experiments.get("E8")
    out = exp.run({"reference": tmp_path / "reference.npz", "models": paths}, settings, CONTEXT)
    per_partition = out.tables["_partitions"]
    assert set(per_partition["partition"]) == {
        "alpha=10/seed0",
        "alpha=10/seed1",
        "alpha=0.1/seed0",
        "alpha=0.1/seed1",
        f"{ONE_CLASS}/seed0",
        f"{ONE_CLASS}/seed1",
    }
    assert (per_partition["n_models"] == 5).all()
    one = per_partition[per_partition.setting == ONE_CLASS]
    pd.testing.assert_frame_equal(  # the one-class partition, scored once, serves both seeds
        one[one.seed == 0].drop(columns=["partition", "seed"]).reset_index(drop=True),
        one[one.seed == 1].drop(columns=["partition", "seed"]).reset_index(drop=True),
    )


def test_check_names_the_bad_key():
    exp = experiments.get("E8")
    config = {"reference": {"source": {"kind": "fashion_mnist"}}, "metrics": {"pr_k": 3, "dc_k": 5}}
    exp.check(SETTINGS, config)
    with pytest.raises(ValueError, match=r"experiments\.E8\.min_rows is 4"):
        exp.check({**SETTINGS, "min_rows": 4}, config)
    unlabelled = {**config, "reference": {"source": {"kind": "folder"}}}
    with pytest.raises(
        ValueError,
        match=r"^config: experiments\.E8 partitions the reference by class, but "
        r"reference\.source is a folder without labels_from_subfolders$",
    ):
        exp.check(SETTINGS, unlabelled)


def test_run_can_split_a_seeded_pool_of_the_reference(tmp_path, pool):
    x, labels, models = pool
    np.savez(tmp_path / "reference.npz", features=x.astype(np.float32), labels=labels)
    np.savez(tmp_path / "model_a.npz", features=models["g0"].astype(np.float32))
    np.savez(tmp_path / "model_b.npz", features=models["g3"].astype(np.float32))
    inputs = {
        "reference": tmp_path / "reference.npz",
        "models": [tmp_path / "model_a.npz", tmp_path / "model_b.npz"],
    }
    settings = {**SETTINGS, "alphas": [1.0], "seeds": 1, "one_class": False}
    exp = experiments.get("E8")
    whole = exp.run(inputs, settings, CONTEXT).tables["_partitions"]
    half = exp.run(inputs, {**settings, "pool_per_class": 30}, CONTEXT).tables["_partitions"]
    assert (whole["heterogeneity"] != half["heterogeneity"]).all()
    with pytest.raises(ValueError, match="fewer than per_class=61"):
        exp.run(inputs, {**settings, "pool_per_class": 61}, CONTEXT)
