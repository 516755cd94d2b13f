"""A site's privacy ledger: every noisy release it made, composed across runs.

Each secure run that adds noise releases a sum (sum_i n_i KD_i of M models, or the
pooled sketch) under Gaussian noise of std sigma_run (the noise of the smallest sum the
site lets the server unmask: t sites of std ``noise-std`` each). Its multiplier is
z = sigma_run / Delta, Delta the L2 sensitivity of the site's entries to one row (4
sqrt(M) for KD, ``metrics.privacy.SUM_SENSITIVITY`` per model; 2 for a sketch). Gaussian releases
compose exactly into one of multiplier (sum_r z_r^-2)^-1/2, whose epsilon at the
budget's delta ``metrics.privacy.epsilon_spent`` gives. The site refuses a run that
would take it past its ``budget-epsilon``; the ledger is a JSON-lines file that only
grows (node config ``ledger``).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from distrank.metrics.privacy import epsilon_spent


def run_multiplier(noise_std: float, threshold: int, sensitivity: float) -> float:
    """z of one run: its smallest unmaskable sum's noise over the L2 sensitivity."""
    return noise_std * math.sqrt(threshold) / sensitivity


@dataclass(frozen=True)
class Ledger:
    """The releases at ``path`` and the budget (epsilon, delta) they may compose to."""

    path: Path
    epsilon: float
    delta: float

    def multipliers(self) -> list[float]:
        if not self.path.exists():
            return []
        return [json.loads(line)["z"] for line in self.path.read_text().splitlines() if line]

    def spent(self, *more: float) -> float:
        """Epsilon at the budget's delta of every recorded release and ``more``."""
        zs = [*self.multipliers(), *more]
        if not zs:
            return 0.0
        if not all(z > 0 for z in zs):
            return math.inf
        total = sum(z**-2 for z in zs) ** -0.5
        return epsilon_spent(noise_multiplier=total, n_releases=1, delta=self.delta)

    def record(self, run: int, z: float, n_models: int) -> float:
        """Append a release of multiplier ``z`` (flushed to disk before any of it leaves
        the site); return the epsilon spent with it. ValueError past the budget."""
        spent = self.spent(z)
        if spent > self.epsilon:
            raise ValueError(
                f"this release would spend epsilon {spent:.4g} of this site's budget "
                f"{self.epsilon:g} (ledger {self.path}, {len(self.multipliers())} releases)"
            )
        entry = {"time": time.time(), "run": run, "z": z, "models": n_models, "spent": spent}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return spent
