"""The figures the docs and the README show cannot go stale.

They are the default study's PNGs, copied by the rule docs_figure
(workflow/rules/docs.smk) into docs/figures/ and committed. Three checks, from cheap to
thorough:

1. the committed set is exactly the PNGs the default study writes (from the experiment
   registry and the agreement families, not from the rule);
2. E3's figure (closed forms, no data, seconds) is made again here from the current code
   and config.yaml, as its pipeline job makes it, and must equal the committed file byte
   for byte: a change to the figure code or to the plotting style is caught on every run;
3. where the default study has been run in this checkout (figures/default/, or the
   folder named by $DISTRANK_STUDY_DIR), every committed figure must equal the study's
   file byte for byte, and Snakemake must find the study's figures up to date with the
   current code, inputs and parameters (nothing to rerun). Without such a run this
   check is skipped, and says so.

Runs are bitwise reproducible on the CPU (tests/reliability/test_determinism.py), which
is what makes a byte comparison the right one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FIGURES = REPO / "docs/figures"
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


def default_config() -> dict:
    """config.yaml as the pipeline sees it: checked by the schema, defaults filled."""
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    validate(config, str(REPO / "workflow/schemas/config.schema.yaml"))
    return config


def study_pngs(config: dict) -> set[str]:
    from distrank import experiments
    from distrank.agreement import FAMILIES

    names = set()
    for key in config["experiments"]:
        for name, path in experiments.get(key).paths("results", "figures").items():
            if name.startswith("png"):
                names.add(Path(path).name)
    if config["agreement"]["enabled"]:
        names |= {
            f"{stem}.png"
            for family, stem in FAMILIES.items()
            if config["agreement"][family]["enabled"]
        }
    return names


def test_the_committed_figures_are_exactly_the_default_studys_pngs():
    committed = {p.name for p in FIGURES.glob("*.png")}
    assert committed == study_pngs(default_config())
    assert not [p.name for p in FIGURES.iterdir() if p.suffix != ".png"]


def test_e3_figure_is_what_the_current_code_makes(tmp_path):
    """E3 run as its pipeline job runs it (scripts/experiment.py: the registry's run and
    write, with the schema-checked settings and the context of common.smk)."""
    pytest.importorskip("matplotlib")
    from distrank import experiments

    config = default_config()
    e3 = experiments.get("E3")
    context = {"extractor": config["features"]["extractor"], "seed": config["seed"]}
    context |= {"metrics": config["metrics"], "models": []}
    paths = e3.paths(str(tmp_path / "results"), str(tmp_path / "figures"))
    e3.write(e3.run({}, config["experiments"]["E3"], context), paths)
    assert Path(paths["png"]).read_bytes() == (FIGURES / "E3_gaussian_theory.png").read_bytes(), (
        "docs/figures/E3_gaussian_theory.png is not what the current code makes: run the "
        "default study (snakemake --cores all copies its figures) and commit docs/figures/"
    )


def study_dir() -> Path | None:
    folder = Path(os.environ.get("DISTRANK_STUDY_DIR") or REPO)
    return folder if (folder / "figures/default").is_dir() else None


@pytest.mark.skipif(
    study_dir() is None,
    reason="the default study has not run in this checkout (figures/default/); "
    "set DISTRANK_STUDY_DIR to a folder where it has",
)
def test_committed_figures_equal_the_default_study_and_the_study_is_up_to_date():
    folder = study_dir()
    names = sorted(p.name for p in FIGURES.glob("*.png"))
    differ = [
        n
        for n in names
        if (folder / "figures/default" / n).read_bytes() != (FIGURES / n).read_bytes()
    ]
    assert differ == [], (
        f"these committed figures differ from {folder}/figures/default/: {differ}; "
        "commit the copies that snakemake --cores all made in docs/figures/"
    )
    targets = [f"figures/default/{n}" for n in names]
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(folder), "--nolock"]
    cmd += ["--configfile", str(REPO / "config.yaml"), "--dry-run", "--cores", "1", *targets]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "Nothing to be done" in run.stdout + run.stderr, (
        "the default study's figures are out of date with the current code, inputs or "
        "parameters: rerun it and commit docs/figures/\n" + (run.stdout + run.stderr)[-3000:]
    )
