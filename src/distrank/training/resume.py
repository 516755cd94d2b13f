"""Checkpoints of a training job, and resuming it from the last one after a kill.

A training job writes, after every round (or evaluation point) ``p``, into one folder:

- ``point-<p>.pt``: the checkpoint, a zoo state (``family``, ``config``, ``generator``,
  ``history``) that :func:`distrank.zoo.sample` reads;
- ``resume.pt``: everything the loop needs to continue after point ``p`` (the networks,
  every optimiser's state, every random stream and data cursor);
- ``fingerprint.json``: the job's settings and a digest of its data. A folder made
  with other settings or data is emptied before training, never resumed from.

Every file is written atomically (checkpoint first, then the resume state), so a job
killed at any instant (SIGKILL included) leaves a folder from which the rerun continues
after the last complete point and computes, on the CPU, the same bits as a run that was
never interrupted: all randomness comes from ``torch.Generator`` objects saved in the
resume state, and the zoo's :func:`~distrank.zoo.torch_session` enforces deterministic
kernels and a fixed thread count. The folder must lie outside the job's declared
Snakemake outputs, which Snakemake deletes when a job fails.
Files are read with ``torch.load(weights_only=True)``: no pickled code.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from distrank._io import read_json, write_json
from distrank.zoo import load_state, save_state

__all__ = ["Checkpoints"]

log = logging.getLogger(__name__)

RESUME = "resume.pt"
FINGERPRINT = "fingerprint.json"


class Checkpoints:
    """The checkpoint folder of one training job (see the module docstring).

    ``fingerprint`` is a JSON-serialisable mapping of everything that determines the
    training (settings, seed, data digest); a folder with another fingerprint is
    cleared.

    Parameters
    ----------
    directory : str or os.PathLike
        The folder, created if needed.
    fingerprint : Mapping
        As above; stored in ``fingerprint.json``.

    Attributes
    ----------
    directory
        pathlib.Path: the folder.
    """

    def __init__(self, directory, fingerprint: Mapping):
        self.directory = Path(directory)
        wanted = json.loads(json.dumps(fingerprint, sort_keys=True))
        path = self.directory / FINGERPRINT
        if path.is_file() and read_json(path) != wanted:
            log.warning(
                "checkpoint folder %s was made with other settings or data; starting afresh",
                self.directory,
            )
            self.clear()
        if not path.is_file():
            self.directory.mkdir(parents=True, exist_ok=True)
            write_json(path, wanted)

    def path(self, point: int) -> Path:
        """The checkpoint file of point ``point``."""
        return self.directory / f"point-{point:05d}.pt"

    def save(self, point: int, checkpoint: Mapping, resume: Mapping) -> None:
        """Write point ``point``'s checkpoint, then the state to resume after it."""
        save_state(self.path(point), dict(checkpoint))
        save_state(self.directory / RESUME, {"point": int(point), **resume})

    def resume(self) -> dict | None:
        """The last saved resume state (with its ``point``), or None to start afresh."""
        path = self.directory / RESUME
        if not path.is_file():
            return None
        state = load_state(path)
        log.info("resuming from %s (after point %d)", path, state["point"])
        return state

    def load(self, point: int) -> dict:
        """The checkpoint of point ``point``."""
        return load_state(self.path(point))

    def clear(self) -> None:
        """Remove this folder's checkpoints, resume state and fingerprint."""
        for pattern in ("point-*.pt", RESUME, FINGERPRINT):
            for file in self.directory.glob(pattern):
                file.unlink()
