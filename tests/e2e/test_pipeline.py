"""The real `snakemake` on a tiny config, asserting the paper's claims from its tables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
pytestmark = pytest.mark.slow


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(workdir),
           "--configfile", str(REPO / "config.yaml"), str(REPO / "tests/e2e/tiny.yaml"),
           "--cores", "2", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("tiny")
    run = snakemake(workdir)
    assert run.returncode == 0, run.stderr[-5000:]
    return workdir


def table(workdir: Path, stem: str) -> pd.DataFrame:
    return pd.read_csv(workdir / "results/tiny" / f"{stem}.csv")


def test_every_output_exists(study):
    for exp, name in [("E1", "kd_consistency"), ("E2", "fd_counterexample"),
                      ("E3", "gaussian_theory"), ("E6", "prdc")]:
        for ext in ("csv", "md", "tex"):
            assert (study / f"results/tiny/{exp}_{name}.{ext}").stat().st_size > 0
        for ext in ("pdf", "png"):
            assert (study / f"figures/tiny/{exp}_{name}.{ext}").stat().st_size > 0


def test_second_run_has_nothing_to_do(study):
    run = snakemake(study, "--dry-run")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Nothing to be done" in run.stdout + run.stderr
