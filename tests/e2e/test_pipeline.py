"""The real `snakemake` on a tiny config, asserting the paper's claims from its tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from distrank import experiments

TINY_CONFIG = Path(__file__).with_name("tiny.yaml")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def study(tiny_study) -> Path:
    return tiny_study


def table(workdir: Path, stem: str) -> pd.DataFrame:
    return pd.read_csv(workdir / "results/tiny" / f"{stem}.csv")


def test_every_output_exists(study):
    """Every table and figure that the registry names for the experiments of the config."""
    config = yaml.safe_load(TINY_CONFIG.read_text())
    assert list(config["experiments"])  # nothing to check otherwise
    for key in config["experiments"]:
        outputs = experiments.get(key).paths("results/tiny", "figures/tiny")
        assert outputs, key
        for paths in outputs.values():
            for path in [paths] if isinstance(paths, str) else paths:
                assert (study / path).stat().st_size > 0, path


def test_second_run_has_nothing_to_do(study, run_tiny):
    run = run_tiny(study, "--dry-run")
    assert run.returncode == 0, run.stdout[-3000:]
    assert "Nothing to be done" in run.stdout


def test_cost_sums_every_benchmark_file_and_names_the_machine(study):
    """results/<study>/cost.csv against benchmarks/<study>/: one job per benchmark file,
    the totals their sums, the critical path a chain ending in a final output's job."""
    from distrank.experiments import cost

    files = sorted((study / "benchmarks/tiny").rglob("*.tsv"))
    measured = [cost.read_benchmark(p) for p in files]
    rows = pd.read_csv(study / "results/tiny/cost.csv").set_index("rule")
    total = rows.loc["total"]
    assert total["jobs"] == len(files) == rows.drop("total")["jobs"].sum()
    assert total["wall_s"] == pytest.approx(sum(b.wall for b in measured), abs=0.01 * len(files))
    assert total["cpu_s"] == pytest.approx(sum(b.cpu for b in measured), abs=0.01 * len(files))
    assert 0 < total["critical_path_s"] <= total["wall_s"]
    assert rows.drop("total")["critical_path_s"].sum() == pytest.approx(
        total["critical_path_s"], abs=0.05
    )
    page = (study / "results/tiny/cost.md").read_text()
    assert "logical CPUs" in page and f"**{len(files)} jobs**" in page


def test_kd_gap_is_the_same_for_every_model(study):
    """Theorem 1 on finite samples: KD_avg - KD_all does not depend on the model."""
    e1 = table(study, "E1_kd_consistency")
    gap = e1["KD_avg"] - e1["KD_all"]
    assert len(e1) == len(yaml.safe_load(TINY_CONFIG.read_text())["models"])
    assert np.ptp(gap) / abs(gap.mean()) < 1e-9
    np.testing.assert_array_equal(e1["KD_gap"], gap)


def test_kd_rankings_agree(study):
    agreement = table(study, "E1_kd_consistency_agreement").set_index("metric")
    assert agreement.loc["KD", "kendall_tau"] == pytest.approx(1.0, abs=1e-12)  # scipy rounding
    assert agreement.loc["KD", "rank_flips"] == 0


def test_recall_all_equals_recall_avg(study):
    """Recall_all = sum (n_i/n) Recall_i exactly: the generated manifold ignores clients."""
    e6 = table(study, "E6_prdc")
    np.testing.assert_allclose(e6["Recall_all"], e6["Recall_avg"], rtol=0, atol=1e-12)


def test_e2_same_client_fd_different_fd_all(study):
    """Proposition 1: G1 and G2 get the same FD at every client, not the same FD_all."""
    e2 = table(study, "E2_fd_counterexample").set_index("client")
    clients = e2.drop(index=["avg", "all"])
    assert len(clients) == 6
    np.testing.assert_allclose(clients["FD_G2"], clients["FD_G1"], rtol=1e-6)
    assert abs(e2.loc["avg", "FD_rel_diff"]) < 0.01
    assert abs(e2.loc["all", "FD_rel_diff"]) > 0.2
    # KD separates them, in both aggregations and the same way
    assert (
        np.sign(e2.loc["avg", "KD_G2"] - e2.loc["avg", "KD_G1"])
        == np.sign(e2.loc["all", "KD_G2"] - e2.loc["all", "KD_G1"])
        != 0
    )


def test_client_scores_average_to_avg(study):
    """The server's D_avg is the size-weighted mean of what the clients released."""
    avg = json.loads((study / "results/tiny/scores/dirichlet/avg.json").read_text())
    n = {c: r["n"] for c, r in avg["clients"].items()}
    for model, scores in avg["models"].items():
        for metric, value in scores["scores"].items():
            local = {c: avg["clients"][c]["scores"][model][metric] for c in n}
            mean = sum(n[c] * local[c] for c in n) / sum(n.values())
            assert value == pytest.approx(mean, rel=1e-12)


def test_report_collects_every_figure(study, run_tiny):
    run = run_tiny(study, "--report", "report.html")
    assert run.returncode == 0, run.stdout[-3000:]
    page = (study / "report.html").read_text(errors="replace")
    for stem in ("E1_kd_consistency", "E2_fd_counterexample", "E3_gaussian_theory", "E6_prdc"):
        assert f"{stem}.png" in page
