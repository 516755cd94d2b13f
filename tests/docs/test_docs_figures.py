"""The figures the docs and the README show cannot go stale.

They are the default study's PNGs and the Inception study's (configs/inception.yaml),
copied by the rule docs_figure (workflow/rules/docs.smk) into docs/figures/ and
docs/figures/inception/ and committed. Three checks, from cheap to thorough:

1. each committed set is exactly the PNGs its study writes (from the experiment
   registry and the agreement families, not from the rule);
2. E3's figure (closed forms, no data, seconds) is made again here from the current code
   and config.yaml, as its pipeline job makes it, and must equal the committed file byte
   for byte: a change to the figure code or to the plotting style is caught on every run;
3. where a study has been run in this checkout (figures/<study>/, or the folder named
   by $DISTRANK_STUDY_DIR), every committed figure of it must equal the study's file
   byte for byte, and Snakemake must find the study's figures up to date with the
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
# study -> its config file and the folder of its committed figures
STUDIES = {
    "default": (REPO / "config.yaml", FIGURES),
    "inception": (REPO / "configs/inception.yaml", FIGURES / "inception"),
}


def study_config(study: str = "default") -> dict:
    """A study's config as the pipeline sees it: checked by the schema, defaults filled."""
    from snakemake.utils import validate

    config = yaml.safe_load(STUDIES[study][0].read_text())
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
    if config.get("agreement", {}).get("enabled", False):
        names |= {
            f"{stem}.png"
            for family, stem in FAMILIES.items()
            if config["agreement"][family]["enabled"]
        }
    return names


@pytest.mark.parametrize("study", STUDIES)
def test_the_committed_figures_are_exactly_the_studys_pngs(study):
    folder = STUDIES[study][1]
    committed = {p.name for p in folder.glob("*.png")}
    assert committed == study_pngs(study_config(study))
    others = {p.name for p in folder.iterdir() if p.suffix != ".png"}
    assert others == ({"inception"} if folder == FIGURES else set())


def test_e3_figure_is_what_the_current_code_makes(tmp_path):
    """E3 run as its pipeline job runs it (scripts/experiment.py: the registry's run and
    write, with the schema-checked settings and the context of common.smk)."""
    pytest.importorskip("matplotlib")
    from distrank import experiments

    config = study_config()
    e3 = experiments.get("E3")
    context = {"extractor": config["features"]["extractor"], "seed": config["seed"]}
    context |= {"metrics": config["metrics"], "models": []}
    paths = e3.paths(str(tmp_path / "results"), str(tmp_path / "figures"))
    e3.write(e3.run({}, config["experiments"]["E3"], context), paths)
    assert Path(paths["png"]).read_bytes() == (FIGURES / "E3_gaussian_theory.png").read_bytes(), (
        "docs/figures/E3_gaussian_theory.png is not what the current code makes: run the "
        "default study (snakemake --cores all copies its figures) and commit docs/figures/"
    )


def study_dir(study: str) -> Path | None:
    folder = Path(os.environ.get("DISTRANK_STUDY_DIR") or REPO)
    return folder if (folder / "figures" / study).is_dir() else None


@pytest.mark.parametrize("study", STUDIES)
def test_committed_figures_equal_the_study_and_the_study_is_up_to_date(study):
    folder = study_dir(study)
    if folder is None:
        pytest.skip(
            f"the {study} study has not run in this checkout (figures/{study}/); "
            "set DISTRANK_STUDY_DIR to a folder where it has"
        )
    configfile, committed = STUDIES[study]
    names = sorted(p.name for p in committed.glob("*.png"))
    differ = [
        n
        for n in names
        if (folder / "figures" / study / n).read_bytes() != (committed / n).read_bytes()
    ]
    assert differ == [], (
        f"these committed figures differ from {folder}/figures/{study}/: {differ}; "
        f"commit the copies that the study's run made in {committed.relative_to(REPO)}/"
    )
    targets = [f"figures/{study}/{n}" for n in names]
    if study == "inception" and (folder / "figures/default").is_dir():
        targets.append("docs/tables/E1_across_networks.csv")  # both studies' E1 and E6
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(folder), "--nolock"]
    cmd += ["--configfile", str(configfile), "--dry-run", "--cores", "1", *targets]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "Nothing to be done" in run.stdout + run.stderr, (
        f"the {study} study's figures are out of date with the current code, inputs or "
        f"parameters: rerun it and commit {committed.relative_to(REPO)}/\n"
        + (run.stdout + run.stderr)[-3000:]
    )
