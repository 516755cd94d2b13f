"""configs/inception.yaml: the default study's data, zoo and partitions on the FID
Inception-v3, every experiment that needs features, its figures copied for the docs."""

from __future__ import annotations

import yaml
from test_config import REPO, dry_run
from test_fullscale_configs import job_stats

INCEPTION = REPO / "configs/inception.yaml"
SHARED = ("seed", "reference", "heldout", "zoo", "n_samples", "models", "partitions", "metrics")


def load(path):
    return yaml.safe_load(path.read_text())


def test_it_is_the_default_study_on_inception_features():
    default, study = load(REPO / "config.yaml"), load(INCEPTION)
    assert {k: study[k] for k in SHARED} == {k: default[k] for k in SHARED}
    assert study["study"] == "inception" and "agreement" not in study
    assert study["features"] | {"batch_size": 0} == {
        "extractor": "inception",
        "backend": "onnx",
        "batch_size": 0,
    }
    # every experiment that reads features; E3 needs none, E4/E5/E7 at smaller counts;
    # E11 (sketches) is not in it yet: its figure would need the 34-minute study rerun
    assert sorted(study["experiments"]) == sorted(set(default["experiments"]) - {"E3", "E11"})
    for key in ("E1", "E2", "E6", "E8", "E9", "E10"):
        assert study["experiments"][key] == default["experiments"][key]


def test_it_plans_every_experiment_and_copies_its_figures_for_the_docs(tmp_path):
    run = dry_run(tmp_path, load(INCEPTION))
    assert run.returncode == 0, run.stderr[-3000:]
    stats = job_stats(run.stdout)
    assert {f"E{i}" for i in (1, 2, 4, 5, 6, 7, 8, 9, 10)} <= set(stats) and "E3" not in stats
    assert "docs/figures/inception/E1_kd_consistency.png" in run.stdout
    assert "figures/default/" not in run.stdout
    # without the default study's tables the comparison is not planned, and says why
    assert "e1_across_networks" not in stats
    assert "docs/tables/E1_across_networks: run the default study first" in run.stdout
