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
    cmd = [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(tmp_path),
        "--configfile",
        str(path),
        "--dry-run",
        "--cores",
        "1",
    ]
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
    # the schema takes any key under metrics: (a plugin may declare options); the check names it
    said = "config: metrics: options: unknown scoring option(s) ['kernal']; known: ["
    assert any(line.startswith(said) for line in out.splitlines()), out[-3000:]
    assert not (tmp_path / "results").exists()


def test_unknown_partition_in_an_experiment_is_named(tmp_path):
    config = default_config()
    config["experiments"]["E1"]["partition"] = "dirichlett"
    run = dry_run(tmp_path, config)
    assert run.returncode != 0
    out = run.stdout + run.stderr
    said = "config: experiments.E1.partition is 'dirichlett', not one of partitions: ["
    assert any(said in line for line in out.splitlines()), out[-3000:]


def planned_jobs(output: str) -> list[dict[str, str]]:
    """The jobs of a dry run: rule, input, wildcards (as printed)."""
    jobs, job = [], None
    for line in output.splitlines():
        if line.startswith(("rule ", "localrule ")):
            job = {"rule": line.split()[-1].rstrip(":")}
            jobs.append(job)
        elif job is not None and line.startswith("    "):
            key, _, value = line.strip().partition(": ")
            job[key] = value
        else:
            job = None
    return jobs


def test_a_client_job_reads_its_own_rows_and_the_models_only(tmp_path):
    """The privacy boundary: every score_client job's inputs are its own client file
    and model feature files, never another client's rows or the pooled reference."""
    run = dry_run(tmp_path, default_config())
    assert run.returncode == 0, run.stderr[-3000:]
    jobs = [j for j in planned_jobs(run.stdout + run.stderr) if j["rule"] == "score_client"]
    assert len(jobs) == 10  # one per client: 4 by_class + 6 one_class
    for job in jobs:
        wildcards = dict(w.split("=") for w in job["wildcards"].split(", "))
        own = f"results/default/clients/{wildcards['partition']}/{wildcards['client']}.npz"
        inputs = job["input"].split(", ")
        assert inputs[0] == own
        assert all(p.startswith("results/default/features/model_") for p in inputs[1:]), inputs
    servers = [j for j in planned_jobs(run.stdout + run.stderr) if j["rule"] == "average_clients"]
    for job in servers:
        for path in job["input"].split(", "):
            assert {"scores", "clients"} <= set(path.split("/")), path


def test_a_config_runs_only_the_experiments_it_lists(tmp_path):
    config = default_config()
    config["experiments"] = {"E3": config["experiments"]["E3"]}
    config["agreement"]["enabled"] = False
    run = dry_run(tmp_path, config)
    assert run.returncode == 0, run.stderr[-3000:]
    # the default study also copies the figure it makes into docs/figures/, and every
    # study writes what it cost (results/<study>/cost.md)
    assert {j["rule"] for j in planned_jobs(run.stdout + run.stderr)} == {
        "E3",
        "all",
        "cost",
        "docs_figure",
    }


def test_planning_loads_no_heavy_library(tmp_path):
    """A no-op rerun stays within seconds: the Snakefile, the config checks and every
    experiment module load neither torch, scipy, scikit-learn, matplotlib nor the other
    heavy libraries; the jobs import them."""
    args = ["-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "-n", "--cores", "1"]
    args += ["--configfile", str(REPO / "config.yaml")]
    probe = f"""
import sys
from snakemake.cli import main
try:
    main({args!r})
except SystemExit as e:
    assert not e.code, e.code
open({str(tmp_path / "modules.txt")!r}, "w").write("\\n".join(sys.modules))
"""
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    modules = (tmp_path / "modules.txt").read_text().split()
    loaded = set(modules) | {name.split(".")[0] for name in modules}
    assert "distrank.experiments.e10_intervals" in loaded  # the checks imported them all
    heavy = {"torch", "scipy", "sklearn", "matplotlib", "onnxruntime", "dp_accounting", "flwr"}
    assert not heavy & loaded


# --- the schema's kinds are the package's -----------------------------------------------------


def schema() -> dict:
    return yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())


def test_the_schemas_model_kinds_are_the_zoos():
    from distrank import zoo

    enum = schema()["$defs"]["model"]["properties"]["kind"]["enum"]
    assert len(enum) == len(set(enum)) and set(enum) == set(zoo.KINDS)


def test_the_schemas_e4_family_kinds_are_the_sweeps():
    from distrank import zoo
    from distrank.experiments.e4_diversity_sweep.sweep import FAMILY_KINDS, FEATURE_KINDS

    e4 = schema()["properties"]["experiments"]["properties"]["E4"]["properties"]
    enum = e4["families"]["additionalProperties"]["properties"]["kind"]["enum"]
    assert len(enum) == len(set(enum)) and set(enum) == set(FAMILY_KINDS)
    assert set(FAMILY_KINDS) - set(FEATURE_KINDS) <= set(zoo.KINDS)


def test_the_schemas_source_and_partition_kinds_are_the_packages():
    from distrank.clients import SCHEMES
    from distrank.data.sources import KINDS

    defs = schema()["$defs"]
    assert set(defs["source"]["properties"]["kind"]["enum"]) == set(KINDS)
    assert set(defs["partition"]["properties"]["kind"]["enum"]) == set(SCHEMES)
