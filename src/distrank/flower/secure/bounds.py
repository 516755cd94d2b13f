"""The bound of FD_all from a secure sum, whose moments carry quantisation errors."""

from __future__ import annotations

import math

import numpy as np


def fd_bound(pooled, model, s1: np.ndarray, e1: float, e2: float) -> float:
    """A bound on |FD(pooled) - FD(exact pooled statistics)| when every entry of S1 is off by
    at most e1 and every entry of S2 by at most e2 (FD's own rounding aside).

    The mean moves by |dm| <= sqrt(d) e1 / n, every covariance entry by at most
    ec = (e2 + (2 e1 (max|S1| + e1) + e1^2) / n) / (n - 1), so |dC|_F <= d ec and the trace
    norm |dC|_1 <= d^1.5 ec. Then |d |m - m_Y|^2| <= 2 |m - m_Y| |dm| + 3 |dm|^2,
    |d tr C| <= d ec, and tr (C^1/2 C_Y C^1/2)^1/2 = |C^1/2 C_Y^1/2|_1 (trace norm) moves
    by at most |C'^1/2 - C^1/2|_F |C_Y^1/2|_F, where |C'^1/2 - C^1/2|_F is at most
    sqrt(2 |dC|_1) (Powers-Stormer, |A^1/2 - B^1/2|_F^2 <= |A - B|_1 for positive
    semi-definite A, B; the 2 covers FD's dropping of C''s negative part, of trace norm
    <= |dC|_1) and, when C is positive definite, |dC|_F / sqrt(lambda_min(C)).
    """
    n, d = pooled.n, pooled.mean.shape[0]
    dm = math.sqrt(d) * e1 / n
    ec = (e2 + (2 * e1 * (float(np.abs(s1).max()) + e1) + e1 * e1) / n) / (n - 1)
    gap = float(np.linalg.norm(pooled.mean - model.mean))
    spread = math.sqrt(max(float(np.trace(model.cov)), 0.0))
    root = math.sqrt(2 * d**1.5 * ec) * spread
    smallest = float(np.linalg.eigvalsh(pooled.cov)[0]) - d * ec  # <= lambda_min(C)
    if smallest > 0:
        root = min(root, d * ec / math.sqrt(smallest) * spread)
    return 2 * gap * dm + 3 * dm * dm + d * ec + 2 * root
