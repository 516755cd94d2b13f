"""A workflow run through a real single-node SLURM equals the local run.

The session fixture starts munged, slurmctld and slurmd on localhost with
tests/slurm/start.sh (root only; skipped elsewhere) and always stops them with
tests/slurm/stop.sh. The test runs a toy workflow once with profiles/local and
once with profiles/slurm, then checks that every non-local job got a SLURM job
id, that SLURM itself recorded those jobs as COMPLETED under this run's name,
and that both runs wrote identical results.

To run the real pipeline the same way, reuse `run_snakemake`, `slurm_job_ids`,
`assert_completed_in_slurm` and `differing_files` with the pipeline's Snakefile
and a study config (tests/reliability/small.yaml, as the last test does).

    .venv/bin/python -m pytest tests/test_slurm.py -m slurm
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SLURM_SCRIPTS = REPO / "tests" / "slurm"
TOY_WORKFLOW = SLURM_SCRIPTS / "toy"
PROFILES = REPO / "profiles"
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
# A hung status query must fail the test, not the CI job: snakemake ignores
# SIGTERM while it waits on SLURM, hence SIGKILL.
RUN_TIMEOUT_S = 300
# Poll SLURM soon after submission; the profile's 10 s suits a real cluster.
FAST_STATUS_CHECKS = ("--slurm-init-seconds-before-status-checks", "2")
DAEMONS = ("munged", "slurmctld", "slurmd")


@dataclass(frozen=True)
class SlurmCluster:
    """The local cluster started by tests/slurm/start.sh."""

    state_dir: Path
    env: dict[str, str]  # what a SLURM client (and snakemake) needs to find it

    def finished_jobs(self) -> dict[str, dict[str, str]]:
        """SLURM's own record of ended jobs (jobcomp/filetxt), by job id."""
        log = self.state_dir / "log" / "jobcomp.log"
        if not log.exists():
            return {}
        jobs = {}
        for line in log.read_text().splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if "JobId" in fields:
                jobs[fields["JobId"]] = fields
        return jobs


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """os.environ without inherited SLURM job settings, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env.update(extra or {})
    return env


def run_snakemake(
    workdir: Path,
    profile: str | Path,
    extra_args: tuple[str, ...] | list[str] = (),
    *,
    snakefile: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: int = RUN_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """Run snakemake in `workdir` with a profile (a path or a name under profiles/).

    stdout and stderr come back together in `.stdout`. The run is killed with
    SIGKILL after `timeout_s` (return code 137, or 124 if `timeout` gives up).
    """
    profile_dir = Path(profile) if Path(profile).is_dir() else PROFILES / str(profile)
    cmd = ["timeout", "-s", "KILL", str(timeout_s), str(SNAKEMAKE)]
    if snakefile is not None:
        cmd += ["--snakefile", str(snakefile)]
    cmd += ["--directory", str(workdir), "--profile", str(profile_dir), *extra_args]
    return subprocess.run(
        cmd,
        cwd=workdir,
        env=_clean_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )


def _describe(proc: subprocess.CompletedProcess[str], tail: int = 60) -> str:
    verdict = "killed by timeout" if proc.returncode in (124, 137) else f"rc={proc.returncode}"
    lines = proc.stdout.splitlines()[-tail:]
    return f"{' '.join(map(str, proc.args))}\n{verdict}; last {len(lines)} lines:\n" + "\n".join(
        lines
    )


def slurm_job_ids(snakemake_output: str) -> list[str]:
    """SLURM job ids that the slurm executor reported submitting, in order."""
    return re.findall(r"has been submitted with SLURM jobid (\d+)", snakemake_output)


def slurm_run_id(snakemake_output: str) -> str:
    """The run's uuid, which the executor uses as every job's SLURM job name."""
    match = re.search(r"SLURM run ID: (\S+)", snakemake_output)
    assert match, "no 'SLURM run ID' in snakemake's output"
    return match.group(1)


def assert_completed_in_slurm(
    cluster: SlurmCluster, job_ids: list[str], job_name: str, wait_s: float = 30
) -> dict[str, dict[str, str]]:
    """Every id is recorded by slurmctld as COMPLETED under `job_name`."""
    deadline = time.monotonic() + wait_s
    while True:  # slurmctld may append the record a moment after squeue's COMPLETED
        jobs = cluster.finished_jobs()
        if all(j in jobs for j in job_ids) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    missing = [j for j in job_ids if j not in jobs]
    assert not missing, f"SLURM has no record of jobs {missing}"
    for j in job_ids:
        assert jobs[j]["JobState"] == "COMPLETED", jobs[j]
        assert jobs[j]["Name"] == job_name, jobs[j]
    return {j: jobs[j] for j in job_ids}


#: what a study writes of its own run: its timings (distrank.experiments.cost), never alike
TIMINGS = {"cost.md", "cost.csv"}


def differing_files(a: Path, b: Path) -> list[str]:
    """Relative paths of files present in only one tree or with different bytes (a
    study's own timings, :data:`TIMINGS`, aside)."""
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.name not in TIMINGS}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file() and p.name not in TIMINGS}
    different = files_a ^ files_b
    different |= {p for p in files_a & files_b if (a / p).read_bytes() != (b / p).read_bytes()}
    return sorted(map(str, different))


def _skip_reason() -> str | None:
    if not sys.platform.startswith("linux"):
        return "a local SLURM needs Linux"
    if os.geteuid() != 0:
        return "needs root: tests/slurm/start.sh starts munged, slurmctld and slurmd"
    binaries = ("munged", "munge", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo",
                "runuser", "timeout")  # fmt: skip
    search_path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    missing = [b for b in binaries if shutil.which(b, path=search_path) is None]
    if missing:
        return f"missing {', '.join(missing)}; ./setup.sh --test installs SLURM and munge"
    if not SNAKEMAKE.exists():
        return f"no snakemake next to {sys.executable}"
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        return "snakemake-executor-plugin-slurm is not installed (extra 'test')"
    return None


def _alive(pid: int) -> bool:
    """Running and not a zombie (the daemons' parent exits, so nobody may reap them)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    state_dir = Path(os.environ.get("SLURM_STATE_DIR", "/tmp/distrank-slurm"))
    script_env = _clean_env({"SLURM_STATE_DIR": str(state_dir)})
    cluster = SlurmCluster(
        state_dir=state_dir,
        env={
            "SLURM_STATE_DIR": str(state_dir),
            "SLURM_CONF": str(state_dir / "slurm.conf"),
            "PATH": f"{state_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        },
    )
    try:
        started = subprocess.run(
            [str(SLURM_SCRIPTS / "start.sh")],
            env=script_env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert started.returncode == 0, f"start.sh failed:\n{started.stdout}{started.stderr}"
        pids = [int((state_dir / "pids" / d).read_text()) for d in DAEMONS]
        yield cluster
    finally:
        stopped = subprocess.run(
            [str(SLURM_SCRIPTS / "stop.sh")],
            env=script_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert stopped.returncode == 0, f"stop.sh failed:\n{stopped.stdout}{stopped.stderr}"
    assert not state_dir.exists()
    assert not [p for p in pids if _alive(p)], "a SLURM daemon survived stop.sh"


def test_toy_workflow_through_slurm_equals_local_run(slurm_cluster, tmp_path):
    local_dir, slurm_dir = tmp_path / "local", tmp_path / "slurm"
    shutil.copytree(TOY_WORKFLOW, local_dir)
    shutil.copytree(TOY_WORKFLOW, slurm_dir)

    local = run_snakemake(local_dir, "local", ["--cores", "2"])
    assert local.returncode == 0, _describe(local)
    assert not slurm_job_ids(local.stdout)

    on_slurm = run_snakemake(
        slurm_dir,
        "slurm",
        [*FAST_STATUS_CHECKS, "--slurm-keep-successful-logs"],
        env=slurm_cluster.env,
    )
    assert on_slurm.returncode == 0, _describe(on_slurm)

    # Three `square` jobs went to SLURM; `total` and `all` are localrules.
    job_ids = slurm_job_ids(on_slurm.stdout)
    assert len(job_ids) == 3 == len(set(job_ids)), _describe(on_slurm)
    records = assert_completed_in_slurm(slurm_cluster, job_ids, slurm_run_id(on_slurm.stdout))
    # Each job ran inside its own allocation, and threads became CPUs.
    for i in range(3):
        log_text = (slurm_dir / f"logs/square_{i}.log").read_text()
        seen = dict(line.split("=", 1) for line in log_text.split())
        job_id = seen["SLURM_JOB_ID"]
        assert job_id in job_ids
        cpus = "2" if i == 0 else "1"
        assert records[job_id]["ProcCnt"] == seen["SLURM_CPUS_PER_TASK"] == seen["threads"] == cpus
        assert (slurm_dir / f".snakemake/slurm_logs/rule_square/{i}/{job_id}.log").is_file()
    assert (local_dir / "results/total.txt").read_text() == "5\n"
    assert not differing_files(local_dir / "results", slurm_dir / "results")


def test_small_study_through_slurm_equals_local_run(slurm_cluster, small_clean, tmp_path):
    """The real pipeline, unchanged, through profiles/slurm: the same results, bytes and all.

    small.yaml has every kind of job (data, training, generation, features, partition,
    client and central scoring, tables, figures) in ~20 jobs. The local run is a
    second, independent clean run, so this also shows determinism.
    """
    config = REPO / "tests/reliability/small.yaml"
    on_slurm = run_snakemake(
        tmp_path,
        "slurm",
        ["--configfile", str(config), *FAST_STATUS_CHECKS],
        snakefile=REPO / "Snakefile",
        env={**slurm_cluster.env, "HF_HUB_OFFLINE": "1", "DISTRANK_QUIET": "1"},
        timeout_s=900,
    )
    assert on_slurm.returncode == 0, _describe(on_slurm)
    job_ids = slurm_job_ids(on_slurm.stdout)
    assert len(job_ids) >= 10, _describe(on_slurm)
    assert_completed_in_slurm(slurm_cluster, job_ids, slurm_run_id(on_slurm.stdout))
    for output in ("results/small/E1_kd_consistency.csv", "figures/small/E3_gaussian_theory.png"):
        assert (tmp_path / output).is_file()
    for top in ("results", "figures"):  # every table, figure, feature and model file
        assert not differing_files(small_clean / top, tmp_path / top)
