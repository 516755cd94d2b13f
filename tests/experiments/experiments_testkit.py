"""Independent reference computations for the experiment tests (numpy/scipy only, no
``distrank.metrics``), and a builder for tidy score tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.linalg

COLUMNS = ["model", "metric", "aggregation", "client", "value"]


def tidy(records) -> pd.DataFrame:
    """Tidy score table from ``(model, metric, aggregation, client, value)`` tuples."""
    return pd.DataFrame(list(records), columns=COLUMNS)


def fd_scipy(x: np.ndarray, y: np.ndarray) -> float:
    """FID formula with ``scipy.linalg.sqrtm`` on the sample statistics (ddof=1)."""
    c1, c2 = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    diff = x.mean(0) - y.mean(0)
    root = scipy.linalg.sqrtm(c1 @ c2)
    return float(diff @ diff + np.trace(c1) + np.trace(c2) - 2 * np.trace(root).real)


def kd_vstat(x: np.ndarray, y: np.ndarray, bandwidth: float = 2.0) -> float:
    """Biased (V-statistic) squared MMD with a Gaussian kernel of fixed bandwidth."""

    def k(a, b):
        sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None] - 2 * a @ b.T
        return np.exp(-sq / (2 * bandwidth**2))

    return float(k(x, x).mean() + k(y, y).mean() - 2 * k(x, y).mean())


def clustered_clients(
    rng, k: int = 6, d: int = 8, sizes=None, spread: float = 3.0, within: float = 0.4
):
    """Variance-limited clients: client i is N(mu_i, within^2 I), means ~ spread * N(0, I)."""
    sizes = sizes or [60 + 10 * i for i in range(k)]
    means = spread * rng.standard_normal((k, d))
    x = np.concatenate(
        [means[i] + within * rng.standard_normal((n, d)) for i, n in enumerate(sizes)]
    )
    labels = np.repeat(np.arange(k), sizes)
    return x, labels, means


def score_models(x, labels, models, *, fd=True, kd=True, bandwidth: float = 2.0) -> pd.DataFrame:
    """Tidy KD/FD table (per client, size-weighted avg, pooled all) computed
    independently with :func:`kd_vstat` and :func:`fd_scipy`."""
    clients = np.unique(labels)
    lam = np.array([(labels == c).sum() for c in clients]) / len(labels)
    funcs = {
        **({"kd": lambda a, b: kd_vstat(a, b, bandwidth)} if kd else {}),
        **({"fd": fd_scipy} if fd else {}),
    }
    rows = []
    for name, y in models.items():
        for metric, f in funcs.items():
            per_client = np.array([f(x[labels == c], y) for c in clients])
            rows += [
                (name, metric, "client", str(c), float(v)) for c, v in zip(clients, per_client)
            ]
            rows += [
                (name, metric, "avg", "", float(lam @ per_client)),
                (name, metric, "all", "", f(x, y)),
            ]
    return tidy(rows)
