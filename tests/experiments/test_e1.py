"""E1: KD gap constant across models; FD rank agreement and flips."""

import numpy as np
import pytest
from experiments_testkit import clustered_clients, score_models, tidy
from scipy import stats

from distrank.figures import e1_figure, e1_table, save


@pytest.fixture(scope="module")
def zoo_scores():
    """Six Gaussian 'models' scored against three variance-limited clients,
    KD and FD computed independently of distrank (numpy V-statistic, scipy sqrtm)."""
    rng = np.random.default_rng(0)
    x, labels, means = clustered_clients(rng, k=3, d=4)
    centre, spread = x.mean(0), x.std(0)
    models = {
        f"scale{s:g}_shift{h:g}": centre + h + s * spread * rng.standard_normal((150, 4))
        for s, h in [(0.3, 0.0), (0.7, 0.0), (1.0, 0.0), (1.5, 0.0), (1.0, 1.0), (0.5, 2.0)]
    }
    return score_models(x, labels, models)


def test_kd_gap_is_constant_and_ranks_agree(zoo_scores):
    table, agreement = e1_table(zoo_scores)
    gap = table["KD_gap"].to_numpy()
    # Theorem 1, finite-sample form: V-statistic, size weights, one kernel.
    assert np.ptp(gap) < 1e-12 * np.abs(gap).max()
    kd = agreement.set_index("metric").loc["KD"]
    assert kd["kendall_tau"] == pytest.approx(1.0) and kd["rank_flips"] == 0
    np.testing.assert_array_equal(table["KD_all_rank"], table["KD_avg_rank"])


def test_table_values_and_ranks_come_from_the_scores(zoo_scores):
    table, agreement = e1_table(zoo_scores)
    values = zoo_scores.set_index(["model", "metric", "aggregation"])["value"]
    for row in table.itertuples():
        assert row.FD_all == values[(row.model, "fd", "all")]
        assert row.FD_avg == values[(row.model, "fd", "avg")]
        assert row.FD_gap == pytest.approx(row.FD_avg - row.FD_all, abs=1e-12)
    np.testing.assert_array_equal(
        table["FD_avg_rank"], stats.rankdata(table["FD_avg"], method="min")
    )
    assert table["KD_all_rank"].tolist() == list(range(1, len(table) + 1))  # sorted best first
    expected = stats.kendalltau(table["FD_avg"], table["FD_all"]).statistic
    assert agreement.set_index("metric").loc["FD", "kendall_tau"] == pytest.approx(
        expected, abs=1e-12
    )


def test_known_rank_flip():
    rows = []
    for model, fd_all, fd_avg in [("a", 1.0, 2.0), ("b", 2.0, 1.0), ("c", 3.0, 3.0)]:
        rows += [(model, "fd", "all", "", fd_all), (model, "fd", "avg", "", fd_avg)]
    table, agreement = e1_table(tidy(rows), metrics=("fd",))
    assert table["model"].tolist() == ["a", "b", "c"]
    assert table["FD_avg_rank"].tolist() == [2, 1, 3]
    assert agreement.loc[0, "kendall_tau"] == pytest.approx(1 / 3)
    assert agreement.loc[0, "rank_flips"] == 1


def test_kd_gap_constant_with_distrank_scorer():
    """End to end with the project's scorer (unbiased U-statistic, float64)."""
    from distrank.metrics import score

    rng = np.random.default_rng(1)
    x, labels, _ = clustered_clients(rng, k=4, d=6)
    models = {
        f"m{i}": x.mean(0) + (0.4 + 0.3 * i) * rng.standard_normal((120, 6)) for i in range(5)
    }
    scores = score(x, labels, models, metrics=("kd", "fd"), dtype="float64", device="cpu")
    table, agreement = e1_table(scores)
    assert np.ptp(table["KD_gap"]) < 1e-9 * np.abs(table["KD_gap"]).max()
    assert agreement.set_index("metric").loc["KD", "kendall_tau"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("extractor", "fd_name"), [("EfficientNet-Lite0", "FD"), ("Inception-v3", "FID")]
)
def test_figure_labels_name_metric_and_extractor(zoo_scores, tmp_path, extractor, fd_name):
    table, _ = e1_table(zoo_scores)
    fig = e1_figure(table, extractor)
    labels = [ax.get_xlabel() for ax in fig.axes] + [ax.get_ylabel() for ax in fig.axes]
    assert all(f"on {extractor} features" in label for label in labels)
    assert any(label.startswith(fd_name + "$") for label in labels)
    if fd_name == "FD":
        assert not any("FID" in label or "KID" in label for label in labels)
    paths = save(fig, tmp_path / "E1_kd_gap")
    assert all(p.stat().st_size > 0 for p in paths.values())


def test_across_networks_by_hand(tmp_path):
    """Two networks' per-model tables (E1's and E6's columns, one set named FID/KID):
    tau from scipy, flips and gap ranges counted here."""
    import pandas as pd

    from distrank.experiments.e1_kd_consistency import across_networks, read_per_model

    models = ["m0", "m1", "m2", "m3"]
    lite = {"KD_all": [1, 2, 3, 4], "KD_avg": [3, 4, 5, 6], "FD_all": [1, 2, 3, 4]}
    lite |= {"FD_avg": [2, 1, 3, 4], "Recall_all": [0.9, 0.8, 0.7, 0.6]}  # flip m0-m1
    fid = {"KID_all": [2, 1, 3, 4], "KID_avg": [2.5, 1.5, 3.5, 4.5], "FID_all": [1, 2, 3, 4]}
    fid |= {"FID_avg": [1, 2, 5, 4], "Recall_all": [0.9, 0.8, 0.6, 0.7]}  # flip m2-m3
    lite["Recall_avg"], fid["Recall_avg"] = lite["Recall_all"], fid["Recall_all"]
    paths = []
    for name, columns in (("lite", lite), ("fid", fid)):
        e1 = pd.DataFrame({"model": models, **{k: v for k, v in columns.items() if "D" in k}})
        e6 = pd.DataFrame({"model": models[::-1], **{k: v[::-1] for k, v in columns.items()}})
        e1.to_csv(tmp_path / f"{name}_e1.csv", index=False)
        e6.to_csv(tmp_path / f"{name}_e6.csv", index=False)
        paths.append([tmp_path / f"{name}_e1.csv", tmp_path / f"{name}_e6.csv"])
    first, second = (read_per_model(p) for p in paths)
    table = across_networks(
        first, second, ("efficientnet_lite0", "inception"), metrics=["kd", "fd", "recall"]
    )
    assert table["metric"].tolist() == ["KD / KID", "FD / FID", "Recall"]
    for row, (x, y) in zip(table.itertuples(), [("KD", "KID"), ("FD", "FID"), ("Recall",) * 2]):
        want = stats.kendalltau(lite[f"{x}_all"], fid[f"{y}_all"])
        assert row.kendall_tau == pytest.approx(want.statistic)
        assert row.p_value == pytest.approx(want.pvalue)
    assert table["flips_efficientnet_lite0"].tolist() == [0, 1, 0]
    assert table["flips_inception"].tolist() == [0, 1, 0]
    assert table["shared_flips"].tolist() == [0, 0, 0]
    assert table["same_flips"].tolist() == [True, False, True]
    assert table["gap_range_efficientnet_lite0"].tolist() == [0.0, 2.0, 0.0]
    assert table["gap_range_inception"].tolist() == [0.0, 2.0, 0.0]
    with pytest.raises(ValueError, match=r"^the two studies score different models: \['m3'\]"):
        across_networks(first, second[second.model != "m3"], ("efficientnet_lite0", "inception"))
