"""The config is checked before any job runs; a typo names the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


def dry_run(tmp_path: Path, config: dict) -> subprocess.CompletedProcess:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
           "--configfile", str(path), "--dry-run", "--cores", "1"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def default_config() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_default_config_plans_every_output(tmp_path):
    run = dry_run(tmp_path, default_config())
    assert run.returncode == 0, run.stderr[-3000:]
    for stem in ("E1_kd_consistency", "E2_fd_counterexample", "E3_gaussian_theory", "E6_prdc"):
        assert f"figures/default/{stem}.png" in run.stdout


def test_typo_in_a_key_is_named(tmp_path):
    config = default_config()
    config["metrics"]["kernal"] = config["metrics"].pop("kernel")
    run = dry_run(tmp_path, config)
    assert run.returncode != 0
    out = run.stdout + run.stderr
    assert "'kernal' was unexpected" in out
    assert not (tmp_path / "results").exists()


def test_unknown_partition_in_an_experiment_is_named(tmp_path):
    config = default_config()
    config["experiments"]["E1"]["partition"] = "dirichlett"
    run = dry_run(tmp_path, config)
    assert run.returncode != 0
    out = run.stdout + run.stderr
    assert "experiments.E1.partition" in out and "dirichlett" in out
