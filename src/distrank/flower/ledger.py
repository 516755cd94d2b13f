"""A site's privacy ledger: every noised release it made, on every path, composed.

Each release (a secure sum, a plain score reply, a plain sketch) is one Gaussian
mechanism of noise multiplier z = 1 / mu: its blocks' stds over their sensitivities,
composed (``flower.policy.Policy.spend``). Gaussian releases compose exactly into one
of multiplier (sum_r z_r^-2)^-1/2, whose epsilon at the budget's delta
``metrics._privacy.epsilon_spent`` gives. The site refuses a release that would take it
past its ``budget-epsilon``. The ledger is a JSON-lines file that only grows, one per
site (its policy's ``ledger``) across runs, federations, metrics, paths and restarts.
Check and append happen under an exclusive lock on ``<ledger>.lock``, and the entry
is fsynced before the lock is released and before any of the release leaves the site:
Flower starts one ClientApp process per message, so spends race.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from distrank.metrics._privacy import epsilon_spent


@dataclass(frozen=True)
class Ledger:
    """The releases at ``path`` and the budget (epsilon, delta) they may compose to."""

    path: Path
    epsilon: float
    delta: float

    def entries(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def multipliers(self) -> list[float]:
        return [entry["z"] for entry in self.entries()]

    def spent(self, *more: float) -> float:
        """Epsilon at the budget's delta of every recorded release and ``more``."""
        zs = [*self.multipliers(), *more]
        if not zs:
            return 0.0
        if not all(z > 0 for z in zs):
            return math.inf
        total = sum(z**-2 for z in zs) ** -0.5
        return epsilon_spent(noise_multiplier=total, n_releases=1, delta=self.delta)

    @contextmanager
    def _locked(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def record(self, run: int, z: float, *, path: str = "", what=()) -> float:
        """Append a release of multiplier ``z`` (fsynced before it returns, under the
        lock); return the epsilon spent with it. ValueError past the budget."""
        with self._locked():
            spent = self.spent(z)
            if spent > self.epsilon:
                raise ValueError(
                    f"this release would spend epsilon {spent:.4g} of this site's budget "
                    f"{self.epsilon:g} (ledger {self.path}, {len(self.multipliers())} releases)"
                )
            entry = {"time": time.time(), "run": run, "path": path, "what": list(what)}
            entry |= {"z": z, "spent": spent}
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
                f.flush()
                os.fsync(f.fileno())
        return spent
