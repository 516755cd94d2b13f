"""Full-scale studies, offline: every configs/*.yaml validates and plans to the end
(dry run, every rule resolved), config mistakes are named before any job runs, and the
download rules run for real against an HTTP server on 127.0.0.1."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import subprocess
import sys
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import yaml
from snakemake.utils import validate

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
SCHEMA = REPO / "workflow/schemas/config.schema.yaml"
# The image studies; configs/agreement-full.yaml runs the agreement study alone.
# Full-scale studies: every config but the agreement study's, the zoo's pretraining and
# the default study on Inception-v3 (offline: tests/e2e/test_inception_config.py) and
# E4's large run (configs/e4-large.yaml, planned below).
STUDIES = sorted(
    p
    for p in (REPO / "configs").glob("*.yaml")
    if not p.stem.startswith(("agreement", "zoo-", "inception", "e4-"))
)
EXPERIMENTS = ("E1_kd_consistency", "E2_fd_counterexample", "E3_gaussian_theory", "E6_prdc")
# Rules every full-scale plan runs (extract_archive too where an artifact is unpacked).
RULES = {
    "download",
    "real_images",
    "generate",
    "extract_features",
    "partition",
    "client_data",
    "score_client",
    "average_clients",
    "score_all_centralized",
    "e2_models_centralized",
    "E1",
    "E2",
    "E3",
    "E6",
}


def snakemake(workdir: Path, config: Path | dict, *args: str) -> subprocess.CompletedProcess:
    """The real snakemake in `workdir` (stdout and stderr together)."""
    if isinstance(config, dict):
        path = workdir / "study.yaml"
        path.write_text(yaml.safe_dump(config))
        config = path
    cmd = [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        str(config),
        "--cores",
        "1",
        *args,
    ]
    return subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120
    )


def job_stats(output: str) -> dict[str, int]:
    """Rule -> job count from the "Job stats" table of a plan."""
    table = output.split("Job stats:", 1)[1].split("total", 1)[0]
    return {
        name: int(count)
        for name, count in (line.split() for line in table.splitlines()[3:] if line.strip())
    }


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_there_are_four_studies():
    assert [p.stem for p in STUDIES] == ["afhq", "cifar10", "ffhq", "imagenet256"]


@pytest.mark.parametrize(
    "path",
    [REPO / "config.yaml", REPO / "tests/e2e/tiny.yaml", REPO / "configs/e4-large.yaml", *STUDIES],
    ids=lambda p: p.stem,
)
def test_config_validates(path):
    config = load(path)
    validate(config, str(SCHEMA))
    assert config["trust_pickles"] is False  # every shipped study starts untrusted


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.stem)
def test_study_plans_every_rule_offline(path, tmp_path):
    run = snakemake(tmp_path, path, "--dry-run")
    assert run.returncode == 0, run.stdout[-3000:]
    config, stats = load(path), job_stats(run.stdout)
    unpacked = any(entry["extract"] for entry in config["downloads"].values())
    assert RULES | ({"extract_archive"} if unpacked else set()) <= set(stats)
    assert stats["download"] == len(config["downloads"])  # every artifact is used
    assert stats["generate"] == len(config["models"])
    for stem in EXPERIMENTS:
        assert f"results/{config['study']}/{stem}.csv" in run.stdout
        assert f"figures/{config['study']}/{stem}.png" in run.stdout
    checkpoints = [m for m, spec in config["models"].items() if spec["kind"] == "checkpoint"]
    if checkpoints:  # planned, but generating them will refuse until trust_pickles: true
        said = f"config: trust_pickles is false, so generating {', '.join(checkpoints)} will fail"
        assert any(said in line for line in run.stdout.splitlines()), run.stdout[-3000:]
    assert not (tmp_path / "results").exists()


def test_e4_large_run_plans_e4_alone_scoring_fd_only(tmp_path):
    run = snakemake(tmp_path, REPO / "configs/e4-large.yaml", "--dry-run")
    assert run.returncode == 0, run.stdout[-3000:]
    stats = job_stats(run.stdout)
    assert {"e4_sweep_models", "e4_fitted_centralized", "e4_fd_centralized", "E4"} <= set(stats)
    assert stats["score_client"] == 6 and "E1" not in stats and "generate" not in stats
    config = load(REPO / "configs/e4-large.yaml")
    assert config["metrics"]["metrics"] == ["fd"] and config["reference"]["per_class"] == 6000
    assert config["experiments"]["E4"]["n_samples"] > 1280  # the features' dimension


def planned_error(tmp_path, config: dict) -> str:
    run = snakemake(tmp_path, config, "--dry-run")
    assert run.returncode != 0
    assert not (tmp_path / "results").exists() and not (tmp_path / "resources").exists()
    return run.stdout


def test_typo_in_a_download_entry_is_named(tmp_path):
    config = load(REPO / "configs/cifar10.yaml")
    config["downloads"]["cifar10"]["mdd5"] = config["downloads"]["cifar10"].pop("md5")
    assert "'mdd5' was unexpected" in planned_error(tmp_path, config)


def test_unknown_artifact_is_named(tmp_path):
    config = load(REPO / "configs/cifar10.yaml")
    config["reference"]["source"]["artifact"] = "cifar1O"
    out = planned_error(tmp_path, config)
    assert "reference.source.artifact is 'cifar1O', not one of downloads" in out


def test_checkpoint_code_must_be_unpacked(tmp_path):
    config = load(REPO / "configs/cifar10.yaml")
    config["downloads"]["edm_code"]["extract"] = False
    assert "downloads.edm_code.extract must be true" in planned_error(tmp_path, config)


def test_trust_pickles_must_be_a_boolean(tmp_path):
    config = load(REPO / "configs/afhq.yaml")
    config["trust_pickles"] = "yes"
    assert "'yes' is not of type 'boolean'" in planned_error(tmp_path, config)


def test_models_from_heldout_need_heldout(tmp_path):
    config = load(REPO / "configs/cifar10.yaml")
    del config["heldout"]
    assert "models.real is a heldout model" in planned_error(tmp_path, config)


# --- the download rules, for real ------------------------------------------------------------


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture
def served(tmp_path):
    """(folder, base URL): files put in the folder are served on 127.0.0.1."""
    root = tmp_path / "served"
    root.mkdir()
    server = ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root))
    )
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
    )
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def adm_batch(seed: int) -> bytes:
    """An ADM / guided-diffusion sample batch: arr_0 uint8 NHWC, arr_1 labels."""
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    np.savez(buffer, rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8), np.arange(6) % 3)
    return buffer.getvalue()


def afhq_zip() -> bytes:
    """A zip laid out like AFHQ's: afhq/{train,val}/{cat,dog,wild}/*.png."""
    from PIL import Image

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for i, (split, species) in enumerate(
            [(s, c) for s in ("train", "val") for c in ("cat", "dog", "wild")]
        ):
            png = io.BytesIO()
            Image.new("RGB", (8, 8), (30 * i, 0, 0)).save(png, format="PNG")
            archive.writestr(f"afhq/{split}/{species}/flickr_{i:06d}.png", png.getvalue())
    return buffer.getvalue()


def test_download_rules_record_checksums_and_reject_a_changed_file(served, tmp_path):
    root, base = served
    batch, archive = adm_batch(0), afhq_zip()
    (root / "admnet_imagenet256.npz").write_bytes(batch)
    (root / "afhq.zip").write_bytes(archive)
    unpublished = {"sha256": None, "md5": None, "size": None}
    config = {
        **load(REPO / "tests/e2e/tiny.yaml"),
        "study": "downloads",
        "downloads_allow_http": True,
        "downloads": {  # the local server is plain http
            "adm": {"url": f"{base}/admnet_imagenet256.npz", **unpublished, "extract": False},
            "afhq": {"url": f"{base}/afhq.zip?dl=1", **unpublished, "extract": True},
        },
    }
    workdir = tmp_path / "work"
    workdir.mkdir()
    downloads, lock = workdir / "resources/downloads", workdir / "resources/checksums.lock"

    run = snakemake(workdir, config, "resources/downloads/adm", "resources/downloads/afhq.d")
    assert run.returncode == 0, run.stdout[-3000:]
    assert (downloads / "adm").read_bytes() == batch
    assert (downloads / "afhq.d/afhq/val/wild/flickr_000005.png").is_file()
    recorded = json.loads(lock.read_text())
    assert recorded == {
        f"{base}/admnet_imagenet256.npz": {
            "sha256": hashlib.sha256(batch).hexdigest(),
            "size": len(batch),
        },
        f"{base}/afhq.zip?dl=1": {
            "sha256": hashlib.sha256(archive).hexdigest(),
            "size": len(archive),
        },
    }

    # Upstream changes the file (same size): the lock file catches it, nothing is kept.
    (downloads / "adm").unlink()
    (root / "admnet_imagenet256.npz").write_bytes(adm_batch(1))
    run = snakemake(workdir, config, "resources/downloads/adm")
    assert run.returncode != 0
    log = (workdir / "logs/downloads/adm.log").read_text()
    assert "ChecksumError" in log and "failed verification: sha256" in log
    assert not (downloads / "adm").exists() and not (downloads / "adm.part").exists()
    assert json.loads(lock.read_text()) == recorded


def test_the_pretrain_config_plans_the_three_families_on_the_whole_train_split(tmp_path):
    run = snakemake(tmp_path, REPO / "configs/zoo-pretrain.yaml", "--dry-run", "pretrain")
    assert run.returncode == 0, run.stdout[-3000:]
    assert job_stats(run.stdout) == {
        "real_images": 1,
        "train_generator": 3,
        "zoo_provenance": 3,
        "pretrain": 1,
    }
