"""E5: scores along federated training; the KD gap is the same at every checkpoint."""

import numpy as np
import pandas as pd
import pytest
from experiments_testkit import clustered_clients
from scipy import stats

from distrank.experiments import get
from distrank.experiments.e5_federated_training import (
    checkpoint_models,
    e5_figure,
    e5_table,
    round_tags,
)
from distrank.metrics import score

SETTINGS = {
    "partition": "by_class",
    "rounds": 15,
    "local_steps": 2,
    "batch_size": 8,
    "n_samples": 50,
}


@pytest.fixture(scope="module")
def checkpoint_scores():
    """30 synthetic 'checkpoints' (two runs of 15 rounds drifting towards the pooled
    reference) against four variance-limited clients, scored by distrank.metrics.score
    in float64 with the unbiased KD."""
    rng = np.random.default_rng(5)
    x, labels, _ = clustered_clients(rng, k=4, d=6, sizes=[40, 25, 60, 15])
    centre, spread = x.mean(0), x.std(0)
    models = {}
    for name, (run, r) in checkpoint_models(SETTINGS).items():
        t = r / SETTINGS["rounds"]
        shift = (1.5 if run == "fedavg" else 1.0) * (1 - t) + 0.1 * rng.standard_normal()
        scale = 0.4 + 0.6 * t if run == "central" else 1.6 - 0.5 * t
        models[name] = centre + shift + scale * spread * rng.standard_normal((50, 6))
    return score(x, labels, models, metrics=["kd", "fd"], dtype="float64")


def test_model_names_follow_runs_and_rounds():
    models = checkpoint_models(SETTINGS)
    assert round_tags(SETTINGS)[:2] == ["r01", "r02"] and len(models) == 30
    assert models["e5-fedavg-r01"] == ("fedavg", 1) and models["e5-central-r15"] == ("central", 15)
    assert get("E5").scores(SETTINGS, {}) == ("by_class", list(models))


def test_kd_gap_is_the_same_at_every_checkpoint_and_kd_ranks_agree(checkpoint_scores):
    table, agreement = e5_table(checkpoint_scores, checkpoint_models(SETTINGS))
    gap = table["KD_gap"].to_numpy()
    # Theorem 1 on finite samples (float64, unbiased KD, lambda_i = n_i / n, one kernel)
    assert np.ptp(gap) <= 1e-9 * np.abs(gap).max()
    kd = agreement[agreement["metric"] == "KD"].set_index("checkpoints")
    assert (kd["kendall_tau"] == 1.0).all() and (kd["rank_flips"] == 0).all()
    assert kd.loc["all", "n_models"] == 30 and kd.loc["fedavg", "n_models"] == 15
    np.testing.assert_array_equal(table["KD_all_rank"], table["KD_avg_rank"])


def test_table_rows_values_and_fd_agreement(checkpoint_scores):
    table, agreement = e5_table(checkpoint_scores, checkpoint_models(SETTINGS))
    assert table["run"].tolist() == ["fedavg"] * 15 + ["central"] * 15
    assert table["round"].tolist() == list(range(1, 16)) * 2
    values = checkpoint_scores.set_index(["model", "metric", "aggregation"])["value"]
    for row in table.itertuples():
        assert row.FD_all == values[(row.model, "fd", "all")]
        assert row.KD_avg == values[(row.model, "kd", "avg")]
    fd = agreement[agreement["metric"] == "FD"].set_index("checkpoints")
    for subset, rows in (("all", table), ("central", table[table["run"] == "central"])):
        want = stats.kendalltau(rows["FD_avg"], rows["FD_all"]).statistic
        assert fd.loc[subset, "kendall_tau"] == pytest.approx(want, abs=1e-12)


def test_figure_has_two_panels_and_one_legend(checkpoint_scores):
    table, _ = e5_table(checkpoint_scores, checkpoint_models(SETTINGS))
    fig = e5_figure(table, "efficientnet_lite0")
    assert len(fig.axes) == 2 and len(fig.legends) == 1
    assert fig.axes[0].get_title(loc="left").startswith("(a) KD: avg")
    assert "on EfficientNet-Lite0 features" in fig.axes[1].get_ylabel()


def test_check_needs_labelled_reference():
    config = {"reference": {"source": {"kind": "folder", "path": "x"}}}
    with pytest.raises(
        ValueError,
        match=r"^config: experiments\.E5 trains a class-conditional GAN, which needs class labels",
    ):
        get("E5").check(SETTINGS, config)


@pytest.mark.slow
def test_tiny_study_kd_gap_and_tau(tiny_study):
    """The tiny config's real FedAvg and central trainings (float64 scores)."""
    table = pd.read_csv(tiny_study / "results/tiny/E5_federated_training.csv")
    agreement = pd.read_csv(tiny_study / "results/tiny/E5_federated_training_agreement.csv")
    assert len(table) == 30
    gap = table["KD_gap"].to_numpy()
    assert np.ptp(gap) <= 1e-9 * np.abs(gap).max()
    assert (agreement.loc[agreement["metric"] == "KD", "kendall_tau"] == 1.0).all()


def test_samples_figure_has_one_row_per_checkpoint_file_and_a_column_per_class(tmp_path):
    from distrank.data.images import save_images
    from distrank.experiments.e5_federated_training import e5_samples

    settings = {"rounds": 12}
    files = []
    for name in ("e5-fedavg-r01", "e5-central-r12"):
        labels = np.array([3, 1, 1, 3])
        files.append(tmp_path / f"model_{name}.npz")
        save_images(files[-1], np.zeros((4, 8, 8), np.uint8), labels, model=name)
    fig = e5_samples(files, checkpoint_models(settings))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["FedAvg, round 1", "central, round 12"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "3"]
