"""Fault rows of the reliability matrix (README.md here): kill -9 of the Snakemake run at
several points and the documented recovery, two runs at once, and a full disk.

The kill points run as one interrupted run of small.yaml in a fresh folder, in DAG order:
each attempt is SIGKILLed (its whole process group) as soon as the job of interest has
started (its log file appears), then the README's recovery command resumes it, until the
last attempt runs to the end and is compared byte for byte with a clean run.
"""

from __future__ import annotations

import base64
import builtins
import errno
import io
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from reliability_kit import STUDY, kill_group, snakemake, start_snakemake, study_files, wait_for

LOGS = f"logs/{STUDY}"
RESULTS = f"results/{STUDY}"
# kill point -> (the log file whose appearance means the job runs, the job's output)
KILL_POINTS = {
    "training": (f"{LOGS}/train_generator/cgan.log", f"{RESULTS}/zoo/cgan.pt"),
    "feature extraction": (
        f"{LOGS}/extract_features/model_cgan-t1.log",
        f"{RESULTS}/features/model_cgan-t1.npz",
    ),
    "client scoring": (
        f"{LOGS}/score_client/dirichlet/c0.log",
        f"{RESULTS}/scores/dirichlet/clients/c0.json",
    ),
    "a table": (f"{LOGS}/E1.log", f"{RESULTS}/E1_kd_consistency.csv"),
}
LOCKED = "Directory cannot be locked"


@dataclass
class Kill:
    running: bool  # the job's output was marked incomplete at the kill
    output_existed: bool
    group_gone: bool  # no process of snakemake's group outlived the kill
    untrusted: list[str]  # files under a final name that differ from the clean run's


@dataclass
class Interrupted:
    workdir: Path
    kills: dict[str, Kill] = field(default_factory=dict)
    locked_rerun: str = ""  # the plain rerun right after the first kill
    concurrent: tuple[int, str] = (0, "")  # a second snakemake while an attempt ran
    final_rc: int | None = None
    final_log: str = ""


def incomplete_markers(workdir: Path) -> set[str]:
    """The outputs Snakemake marked as being written (.snakemake/incomplete/<base64>)."""
    folder = workdir / ".snakemake/incomplete"
    if not folder.is_dir():
        return set()
    return {base64.b64decode(p.name).decode() for p in folder.iterdir() if p.is_file()}


def group_gone(pgid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def untrusted(workdir: Path, clean: dict[str, bytes], marked: set[str]) -> list[str]:
    """Files under a final name (not a dot-prefixed temporary, not marked incomplete)
    whose bytes are not the clean run's: what a rerun would wrongly trust."""
    return [
        name
        for name, data in study_files(workdir).items()
        if not Path(name).name.startswith(".") and name not in marked and clean.get(name) != data
    ]


def recover(workdir: Path, log: Path, *, first: bool, record: Interrupted):
    """The README's recovery: unlock (after checking that a plain rerun is refused), then
    restart with --rerun-incomplete, in the background."""
    if first:
        record.locked_rerun = snakemake(workdir, "--cores", "2", "--rerun-incomplete").stdout
    unlock = snakemake(workdir, "--unlock")
    assert unlock.returncode == 0, unlock.stdout[-3000:]
    return start_snakemake(workdir, log, "--cores", "2", "--rerun-incomplete")


@pytest.fixture(scope="module")
def interrupted(small_clean, tmp_path_factory) -> Interrupted:
    clean = study_files(small_clean)
    workdir = tmp_path_factory.mktemp("small-killed")
    record = Interrupted(workdir)
    process = start_snakemake(workdir, workdir / "attempt-0.log", "--cores", "2")
    try:
        for i, (point, (log, output)) in enumerate(KILL_POINTS.items()):
            wait_for(workdir / log, process)
            kill_group(process)
            marked = incomplete_markers(workdir)
            record.kills[point] = Kill(
                running=output in marked,
                output_existed=(workdir / output).exists(),
                group_gone=group_gone(process.pid),
                untrusted=untrusted(workdir, clean, marked),
            )
            process = recover(
                workdir, workdir / f"attempt-{i + 1}.log", first=i == 0, record=record
            )
            if i == 0:  # the most work left: a second run at once must meet the lock
                wait_for(workdir / ".snakemake/locks/0.output.lock", process)
                second = snakemake(workdir, "--cores", "1", "--rerun-incomplete", timeout=300)
                record.concurrent = (second.returncode, second.stdout)
        record.final_rc = process.wait(timeout=900)
    finally:
        kill_group(process)  # whatever failed above, no run outlives the fixture
    record.final_log = (workdir / f"attempt-{len(KILL_POINTS)}.log").read_text()
    return record


@pytest.mark.slow
@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_kill_9_lands_while_the_job_runs_and_leaves_nothing_to_trust(interrupted, point):
    kill = interrupted.kills[point]
    assert kill.running and not kill.output_existed, kill
    assert kill.group_gone, f"processes of the killed run outlived SIGKILL at {point}"
    assert kill.untrusted == [], f"half-written files under final names: {kill.untrusted}"


@pytest.mark.slow
def test_a_plain_rerun_after_kill_9_names_the_stale_lock(interrupted):
    assert LOCKED in interrupted.locked_rerun and "--unlock" in interrupted.locked_rerun


@pytest.mark.slow
def test_the_documented_recovery_gives_the_clean_runs_tables_byte_for_byte(
    interrupted, small_clean
):
    assert interrupted.final_rc == 0, interrupted.final_log[-5000:]
    got, want = study_files(interrupted.workdir), study_files(small_clean)
    assert sorted(got) == sorted(want)
    assert [name for name in want if got[name] != want[name]] == []
    assert any(name.endswith("E1_kd_consistency.csv") for name in got)
    assert incomplete_markers(interrupted.workdir) == set()


@pytest.mark.slow
def test_a_second_run_at_once_is_refused_by_the_lock(interrupted):
    returncode, output = interrupted.concurrent
    assert returncode != 0 and LOCKED in output, output[-3000:]
    # ... and the first run finished undisturbed with the clean tables (test above)
    assert interrupted.final_rc == 0


# --- a full disk while writing a features file, a cache entry or any other output ------------


class FullDisk(io.FileIO):
    """A file on a disk with ``room`` bytes left: a write past it fails with ENOSPC."""

    def __init__(self, path, room: int):
        super().__init__(path, "w")
        self.room = room

    def write(self, data):
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.name)
        return super().write(data)


def full_disk_open(room: int):
    """``open`` for distrank._io.atomic_open whose files hold at most ``room`` bytes."""

    def open_(path, mode="r", **kwargs):
        if not set(mode) & set("wax+"):  # reading (a digest, say) needs no room
            return builtins.open(path, mode, **kwargs)
        buffered = io.BufferedWriter(FullDisk(path, room))
        return buffered if "b" in mode else io.TextIOWrapper(buffered, **kwargs)

    return open_


class Means:
    """A tiny deterministic extractor for the feature cache (per-channel means)."""

    name, dim, backend, device = "means", 2, "torch", "cpu"

    def __init__(self):
        self.calls = 0

    def metadata(self):
        return {"extractor": self.name, "d": self.dim, "backend": self.backend}

    def extract(self, images, batch_size=None, desc=None):
        self.calls += 1
        m = images.astype(np.float32).mean(axis=(1, 2, 3))
        return np.stack([m, 2 * m], axis=1)


@pytest.fixture
def image_file(tmp_path):
    from distrank.data.images import save_images

    rng = np.random.default_rng(0)
    return save_images(tmp_path / "images.npz", rng.integers(0, 256, (10, 8, 8, 1), np.uint8))


@pytest.mark.parametrize("room", [0, 200], ids=["nothing-written", "half-written"])
def test_a_full_disk_while_writing_features_leaves_nothing_a_later_run_trusts(
    image_file, tmp_path, monkeypatch, room
):
    import distrank._io
    from distrank.features.cache import cached_features, meta_path

    out = tmp_path / "cache" / "features.npz"
    with monkeypatch.context() as patch:
        patch.setattr(distrank._io, "open", full_disk_open(room), raising=False)
        with pytest.raises(OSError) as err:
            cached_features(image_file, out, Means())
    assert err.value.errno == errno.ENOSPC
    assert list(out.parent.iterdir()) == []  # no features, no sidecar, no temporary file
    extractor = Means()
    features = cached_features(image_file, out, extractor)  # the disk has room again
    assert extractor.calls == 1 and features.shape == (10, 2)
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name, meta_path(out).name]


def test_a_full_disk_while_writing_the_sidecar_leaves_features_that_are_not_trusted(
    image_file, tmp_path, monkeypatch
):
    import distrank._io
    from distrank.features.cache import cached_features, meta_path

    out = tmp_path / "features.npz"
    real_open = open

    def sidecar_fails(path, mode="r", **kwargs):
        if str(path).endswith(".json"):
            return full_disk_open(0)(path, mode, **kwargs)
        return real_open(path, mode, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(distrank._io, "open", sidecar_fails, raising=False)
        with pytest.raises(OSError, match="No space left"):
            cached_features(image_file, out, Means())
    assert out.exists() and not meta_path(out).exists()  # features without their sidecar ...
    extractor = Means()
    cached_features(image_file, out, extractor)
    assert extractor.calls == 1  # ... are extracted again, not trusted
    assert json.loads(meta_path(out).read_text())["extractor"] == "means"


def write_each(kind: str, path: Path) -> None:
    from distrank._io import write_json
    from distrank.data.images import save_images
    from distrank.tables import write_table
    from distrank.zoo import save_state

    if kind == "image set":
        save_images(path, np.zeros((50, 28, 28, 1), np.uint8))
    elif kind == "score file":
        write_json(path, {"client": "c0", "models": {f"m{i}": i for i in range(100)}})
    elif kind == "zoo state":
        import torch

        save_state(path, {"w": torch.zeros(1000)})
    elif kind == "table":
        import pandas as pd

        write_table(pd.DataFrame({"model": [f"m{i}" for i in range(100)]}), path.with_suffix(""))


@pytest.mark.parametrize("kind", ["image set", "score file", "zoo state", "table"])
def test_a_full_disk_leaves_no_output_of_any_writer(tmp_path, monkeypatch, kind):
    import distrank._io

    path = (
        tmp_path
        / "out"
        / {
            "image set": "x.npz",
            "score file": "c0.json",
            "zoo state": "cgan.pt",
            "table": "E1.csv",
        }[kind]
    )
    with monkeypatch.context() as patch:
        patch.setattr(distrank._io, "open", full_disk_open(100), raising=False)
        with pytest.raises(OSError, match="No space left"):
            write_each(kind, path)
    assert list(path.parent.iterdir()) == []
    write_each(kind, path)  # with room, the same call writes the file
    assert path.exists()
