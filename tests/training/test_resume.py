"""A training job killed with SIGKILL, rerun, ends with the same checkpoints, bit for bit.

Each test runs a small training in a subprocess, kills it once a few checkpoints exist,
runs the same command again (it resumes from the checkpoint folder), and compares the
final bundle's bytes with those of the same command never interrupted. What it takes:
every random stream in the resume state, deterministic kernels and a fixed thread count
(torch_session), the same process environment (thread variables: a run inside pytest
differs from a subprocess in the last bits), and equal Python objects in what is saved.
"""

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import torch
    from distrank.training.evaluate import save_bundle

    trainer, folder, out = sys.argv[1:]
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 12)
    images = rng.integers(0, 40, size=(120, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        images[i, 2 * c:2 * c + 8] += 200
    clients = np.select([labels <= 4, labels <= 6], [0, 1], 2)
    net = {"z_dim": 8, "width": 8}
    if trainer in ("fedavg_cgan", "fedavgm_cgan"):
        from distrank.training.federated import client_shards
        from distrank.training.fedavg import train_cgan_fedavg
        states = train_cgan_fedavg(client_shards(images, labels, clients), seed=0, rounds=ROUNDS,
                                   local_steps=1, batch_size=8, checkpoint_dir=folder,
                                   threads=1, server_momentum=0.5 * (trainer[6] == "m"), **net)
    else:
        from distrank.metrics._kernels import make_kernel
        from distrank.training.mmd import finetune_mmd
        from distrank.zoo.families import to_float
        from distrank.zoo.cgan import train_cgan
        state = train_cgan(images, labels, seed=0, steps=4, batch_size=8, threads=1, **net)
        torch.manual_seed(0)
        embedding = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 6))
        embedding.requires_grad_(False)
        with torch.no_grad():
            reference = embedding(to_float(images))
        points = finetune_mmd(state, reference, clients, method=trainer.split("_")[1],
                              kernel=make_kernel("rbf", {"bandwidth": 2.0}, 6),
                              embedding=embedding, seed=0, steps=ROUNDS, batch_size=8, lr=1e-3,
                              eval_every=2, local_steps=2, checkpoint_dir=folder, threads=1)
        states = [s for _, s in points]
    save_bundle(out, {str(i): s for i, s in enumerate(states)})
""").replace("ROUNDS", "30")


def command(tmp_path: Path, trainer: str, name: str) -> tuple[list[str], Path, Path]:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    folder, out = tmp_path / f"{name}.resume", tmp_path / f"{name}.pt"
    return [sys.executable, str(script), trainer, str(folder), str(out)], folder, out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "trainer",
    [
        "fedavg_cgan",
        "fedavgm_cgan",  # FedAvgM: the server's velocity is in the resume state
        pytest.param("mmd_fedavg", marks=pytest.mark.slow),  # ~25 s each on 2 busy cores
        pytest.param("mmd_fedsgd", marks=pytest.mark.slow),
    ],
)
def test_sigkill_then_rerun_gives_the_uninterrupted_checkpoints(tmp_path, trainer):
    env = {**os.environ, "DISTRANK_QUIET": "1", "OMP_NUM_THREADS": "1"}
    cmd, _, clean = command(tmp_path, trainer, "clean")
    subprocess.run(cmd, check=True, timeout=300, env=env)  # the same command, uninterrupted

    cmd, folder, out = command(tmp_path, trainer, "killed")
    job = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    # kill once a few checkpoints are on disk, mid-training
    while not (folder / "point-00006.pt").exists():
        assert job.poll() is None, "the job ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint within the time limit"
        time.sleep(0.005)
    job.send_signal(signal.SIGKILL)
    job.wait(timeout=60)
    assert job.returncode == -signal.SIGKILL and not out.exists()
    assert not (folder / "point-00030.pt").exists()
    first = (folder / "point-00002.pt").stat().st_mtime_ns

    rerun = subprocess.run(
        cmd, env={**env, "DISTRANK_QUIET": "0"}, timeout=300, text=True, stderr=subprocess.PIPE
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert (folder / "point-00002.pt").stat().st_mtime_ns == first  # not recomputed
    assert sha256(out) == sha256(clean)


def _job_pids(needle: str) -> list[int]:
    """PIDs of processes whose command line contains ``needle``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmdline and "snakemake" not in cmdline.split(" ")[0]:
                pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_a_killed_pipeline_job_resumes_when_snakemake_is_rerun(tiny_study, tmp_path):
    """The documented command: rerun snakemake. SIGKILL hits E5's FedAvg training job in
    the middle; Snakemake deletes the failed job's declared output, the checkpoint folder
    (not an output) survives, and the rerun's bundle equals an uninterrupted run's (the
    tiny study's)."""
    repo = Path(__file__).resolve().parents[2]
    snakemake = Path(sys.executable).with_name("snakemake")
    target = "results/tiny/training/E5/fedavg.pt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}

    def cmd(workdir):
        return [
            str(snakemake),
            "-s",
            str(repo / "Snakefile"),
            "-d",
            str(workdir),
            "--configfile",
            str(repo / "tests/e2e/tiny.yaml"),
            "--cores",
            "1",
            target,
        ]

    killed = tmp_path / "killed"
    folder = killed / "results/tiny/training/E5/fedavg.resume"
    run = subprocess.Popen(
        cmd(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 900
    while not (folder / "point-00003.pt").exists():
        assert run.poll() is None, "snakemake ended before the job could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    pids = _job_pids(f"{killed}/.snakemake/scripts/")
    assert pids, "no training job process found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert run.wait(timeout=300) != 0
    assert not (killed / target).exists() and (folder / "resume.pt").exists()
    assert not (folder / "point-00015.pt").exists()
    rerun = subprocess.run(cmd(killed), timeout=900, env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    log = (killed / "logs/tiny/e5_train_centralized/fedavg.log").read_text()
    assert "resuming from" in log
    assert sha256(killed / target) == sha256(tiny_study / target)
