"""E7: MMD fine-tuning; FedSGD's curve is the central one."""

import numpy as np
import pandas as pd
import pytest
from experiments_testkit import tidy

from distrank.experiments import get
from distrank.experiments.e7_mmd_finetuning import (
    NONE,
    e7_figure,
    e7_table,
    evaluation_models,
    step_tags,
)

SETTINGS = {
    "partition": "by_class",
    "steps": 12,
    "eval_every": 3,
    "local_steps": 3,
    "batch_size": 8,
    "lr": 1e-4,
    "kernel": "rbf",
    "bandwidth": None,
    "n_samples": 50,
}


def synthetic_scores(models):
    rows = []
    for name, (method, step) in models.items():
        kd = 2.0 - {"none": 0.0, "fedsgd": 0.1, "central": 0.1, "fedavg": 0.07}[method] * step
        for metric, value in (("kd", kd), ("fd", 100 * kd)):
            rows += [(name, metric, "all", "", value), (name, metric, "avg", "", value + 0.5)]
    return tidy(rows)


def test_model_names():
    models = evaluation_models(SETTINGS)
    assert step_tags(SETTINGS) == ["s03", "s06", "s09", "s12"]
    assert models[NONE] == ("none", 0) and models["e7-fedavg-s12"] == ("fedavg", 12)
    assert len(models) == 1 + 3 * 4
    assert get("E7").scores(SETTINGS, {}) == ("by_class", list(models))


def test_table_starts_every_run_at_the_untouched_model():
    models = evaluation_models(SETTINGS)
    table = e7_table(synthetic_scores(models), models, steps=12)
    assert table["run"].unique().tolist() == ["fedsgd", "fedavg", "central", "none"]
    for _, part in table.groupby("run", sort=False):
        assert part["step"].tolist() == [0, 3, 6, 9, 12]
        assert part["model"].iloc[0] == NONE
    none = table[table["run"] == "none"]
    assert (none["model"] == NONE).all() and none["KD_all"].nunique() == 1
    row = table[(table["run"] == "fedavg") & (table["step"] == 6)].iloc[0]
    assert row["KD_all"] == pytest.approx(2.0 - 0.42) and row["KD_avg"] == row["KD_all"] + 0.5
    assert list(table.columns) == ["run", "step", "model", "KD_all", "FD_all", "KD_avg", "FD_avg"]


def test_figure_draws_four_runs():
    models = evaluation_models(SETTINGS)
    fig = e7_figure(e7_table(synthetic_scores(models), models, steps=12), "efficientnet_lite0")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "FedSGD",
        "FedAvg",
        "centralized",
        "no fine-tuning",
    ]
    assert ax.get_title(loc="left") == "FedSGD vs centralized: max relative difference 0"


def test_checks():
    config = {"zoo": {"cgan": {"steps": 10}}}
    get("E7").check(SETTINGS, config)
    with pytest.raises(
        ValueError,
        match=r"^config: experiments\.E7 fine-tunes the zoo's cGAN, but zoo\.cgan is not set$",
    ):
        get("E7").check(SETTINGS, {"zoo": {}})
    with pytest.raises(ValueError, match="multiple of eval_every"):
        get("E7").check({**SETTINGS, "steps": 10}, config)
    with pytest.raises(ValueError, match="multiple of local_steps"):
        get("E7").check({**SETTINGS, "local_steps": 2}, config)


@pytest.mark.slow
def test_tiny_study_fedsgd_is_central_and_fine_tuning_helps(tiny_study):
    table = pd.read_csv(tiny_study / "results/tiny/E7_mmd_finetuning.csv")
    by_run = {run: part.set_index("step")["KD_all"] for run, part in table.groupby("run")}
    np.testing.assert_allclose(by_run["fedsgd"], by_run["central"], rtol=1e-6, atol=0)
    last = table["step"].max()
    for run in ("fedsgd", "fedavg", "central"):
        assert by_run[run][last] < by_run["none"][last], run
