"""Generators trained once, long, and shipped as checkpoints, the way the paper
downloads pretrained ones: the sha256 pin a config holds for each, and the provenance
record written beside every trained state (configs/zoo-pretrain.yaml makes them)."""

from __future__ import annotations

import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from distrank._checks import InputError
from distrank._io import atomic_path, file_digest

__all__ = ["verify", "install", "provenance"]

_PACKAGES = ("distrank", "torch", "numpy")


def verify(path, sha256: str) -> None:
    """Raise :class:`~distrank._checks.InputError` naming ``path`` unless its bytes
    have the sha256 ``sha256`` (or it is missing)."""
    if not Path(path).is_file():
        raise InputError("no such checkpoint file", path=path)
    actual = file_digest(path)
    if actual != sha256:
        raise InputError(
            f"sha256 is {actual}, but the config pins {sha256}: the file is not the "
            "checkpoint the study was made with; restore it (git checkout) or retrain "
            "it with configs/zoo-pretrain.yaml and pin the new sha256",
            path=path,
        )


def install(path, sha256: str, out) -> None:
    """Copy the checkpoint ``path`` to ``out`` after :func:`verify`; nothing is
    written when it fails."""
    verify(path, sha256)
    with atomic_path(out) as tmp:
        shutil.copyfile(path, tmp)


def provenance(
    state_file, state: dict, *, settings: dict, seed: int, threads: int, images: dict, wall_s: float
) -> dict:
    """What made a trained state: its file's sha256, the training ``settings`` with
    ``seed`` and ``threads`` (CPU results depend on both), the training ``images``
    (their source and count), steps, wall time, package versions, the git commit of
    the code and the loss history recorded in the state."""
    return {
        "family": state["family"],
        "file": Path(state_file).name,
        "sha256": file_digest(state_file),
        "config": {**settings, "seed": seed, "threads": threads},
        "images": images,
        "steps": settings["steps"],
        "wall_s": round(wall_s, 1),
        "versions": {"python": platform.python_version()}
        | {name: metadata.version(name) for name in _PACKAGES},
        "commit": _commit(),
        "history": state["history"],
    }


def job_provenance(
    state_file,
    images_file,
    benchmark_file,
    *,
    settings: dict,
    seed: int,
    threads: int,
    images: dict,
) -> dict:
    """:func:`provenance` of a training job: its state, the count of its training images
    (``images_file``) and its wall time (the last ``s`` of its benchmark file, the job's
    cost)."""
    import pandas as pd

    from distrank.data.images import load_images
    from distrank.zoo import load_state

    return provenance(
        state_file,
        load_state(state_file),
        settings=settings,
        seed=seed,
        threads=threads,
        images={**images, "count": len(load_images(images_file)[0])},
        wall_s=float(pd.read_csv(benchmark_file, sep="\t")["s"].iloc[-1]),
    )


def _commit() -> str | None:
    """HEAD of the git checkout holding this code, with ``-dirty`` when it has changes
    to tracked files; None outside a checkout."""
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=40"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head or None
