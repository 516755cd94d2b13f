"""Determinism rows of the reliability matrix (README.md here): re-executed jobs write the
same bytes, and another seed changes the sampled quantities only.

(The kill -9 run of test_faults.py is a second execution of every job of small.yaml; its
final tables, figures and feature files equal the clean run's byte for byte.)
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from reliability_kit import SMALL, STUDY, copy_study, snakemake, study_files

RESULTS = f"results/{STUDY}"
E3 = [f"{RESULTS}/E3_gaussian_theory{s}.{e}" for s in ("", "_curves") for e in ("csv", "md", "tex")]
E3 += [f"figures/{STUDY}/E3_gaussian_theory.{e}" for e in ("pdf", "png")]
SAMPLED = [
    f"{RESULTS}/images/reference.npz",
    f"{RESULTS}/images/heldout.npz",
    f"{RESULTS}/clients/dirichlet/manifest.csv",
]


@pytest.mark.slow
def test_another_seed_changes_the_samples_and_not_the_closed_forms(small_clean, tmp_path):
    work = copy_study(small_clean, tmp_path / "seed1")
    config = yaml.safe_load(SMALL.read_text())
    config["seed"] = 1
    (tmp_path / "seed1.yaml").write_text(yaml.safe_dump(config))
    run = snakemake(work, "--cores", "2", "--force", *SAMPLED, *E3, config=tmp_path / "seed1.yaml")
    assert run.returncode == 0, run.stdout[-5000:]
    assert "rule E3:" in run.stdout  # E3 ran again under seed 1 ...
    before, after = study_files(small_clean), study_files(work)
    assert [name for name in E3 if after[name] != before[name]] == []  # ... to the same bytes
    assert [name for name in SAMPLED if after[name] == before[name]] == []
    for name in SAMPLED[:2]:  # the same kind of sample: size, shape and classes per class
        with np.load(work / name) as new, np.load(small_clean / name) as old:
            assert new["images"].shape == old["images"].shape
            assert (np.bincount(new["labels"]) == np.bincount(old["labels"])).all()
            assert not np.array_equal(new["images"], old["images"])


TINY = "results/tiny"
# Jobs of the tiny study that small.yaml does not have, run again with --force: the
# experiments first (their inputs stay up to date), then the models' images, features and
# a partition (which make every score downstream out of date, so they come last).
TINY_EXPERIMENTS = [
    f"{TINY}/E2_fd_counterexample.csv",
    f"{TINY}/E6_prdc.csv",
    f"{TINY}/E9_private_ranking.csv",
    f"{TINY}/A1_stacking.csv",
]
TINY_SAMPLES = [
    f"{TINY}/images/model_{m}.npz" for m in ("diffusion-g1", "vae-t1", "blur-2", "drop-4")
]
TINY_SAMPLES += [
    f"{TINY}/features/model_diffusion-g1.npz",
    f"{TINY}/clients/one_class/manifest.csv",
]


def tiny_outputs(workdir):
    return {
        str(p.relative_to(workdir)): p.read_bytes()
        for top in ("results/tiny", "figures/tiny")
        for p in sorted((workdir / top).rglob("*"))
        if p.is_file() and p.name not in ("cost.md", "cost.csv")  # the run's own timings
    }


@pytest.mark.slow
def test_jobs_of_the_tiny_study_run_again_write_the_same_bytes(tiny_study, run_tiny, tmp_path):
    work = copy_study(tiny_study, tmp_path / "tiny")
    before = tiny_outputs(tiny_study)
    ran = []
    for targets in (TINY_EXPERIMENTS, TINY_SAMPLES):
        run = run_tiny(work, "--cores", "2", "--force", *targets, timeout=600)
        assert run.returncode == 0, run.stdout[-5000:]
        ran += [
            line.split()[-1].rstrip(":")
            for line in run.stdout.splitlines()
            if line.startswith(("rule ", "localrule "))
        ]
    assert sorted(ran) == sorted(
        [
            "E2",
            "E6",
            "E9",
            "A1",
            "generate",
            "generate",
            "generate",
            "generate",
            "extract_features",
            "partition",
        ]
    )
    after = tiny_outputs(work)
    assert sorted(after) == sorted(before)
    assert [name for name in before if after[name] != before[name]] == []
