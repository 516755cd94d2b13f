"""Helpers of the reliability tests: the small study (small.yaml) run by the real
snakemake, in its own process group so that one SIGKILL ends it with all its jobs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
SMALL = Path(__file__).with_name("small.yaml")
STUDY = "small"
RUN_TIMEOUT = 900  # seconds: a whole run of small.yaml (about 1 CPU-minute)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "DISTRANK_QUIET": "1"}


def snakemake_command(workdir: Path, *args: str, config: Path = SMALL) -> list[str]:
    return [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        str(config),
        *args,
    ]


def snakemake(
    workdir: Path, *args: str, config: Path = SMALL, timeout: float = RUN_TIMEOUT
) -> subprocess.CompletedProcess:
    """The real snakemake on ``config`` in ``workdir`` (stdout and stderr together)."""
    return subprocess.run(
        snakemake_command(workdir, *args, config=config),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
        timeout=timeout,
    )


def start_snakemake(workdir: Path, log: Path, *args: str) -> subprocess.Popen:
    """snakemake in its own process group (so one killpg ends it and all its jobs)."""
    with open(log, "w") as out:
        return subprocess.Popen(
            snakemake_command(workdir, *args),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=ENV,
            start_new_session=True,
        )


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL snakemake's whole process group and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=60)


def wait_for(path: Path, process: subprocess.Popen, *, timeout: float = RUN_TIMEOUT) -> None:
    """Return once ``path`` exists; fail if ``process`` ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(
                f"snakemake ended (rc {process.returncode}) before {path} appeared"
            )
        if time.monotonic() > deadline:
            kill_group(process)
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


def study_files(workdir: Path) -> dict[str, bytes]:
    """Every result, figure and feature file of the study, by relative path (not its
    timings, ``cost.md`` and ``cost.csv``: what the run itself cost)."""
    files = {}
    for top in (f"results/{STUDY}", f"figures/{STUDY}"):
        for path in sorted((workdir / top).rglob("*")):
            if path.is_file() and path.name not in ("cost.md", "cost.csv"):
                files[str(path.relative_to(workdir))] = path.read_bytes()
    return files


def copy_study(source: Path, dest: Path) -> Path:
    """A copy of a finished working directory, timestamps kept (so nothing is out of date)."""
    shutil.copytree(source, dest, symlinks=True)
    return dest
