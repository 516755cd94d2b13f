r"""Models made in feature space, without a network or images: the two families that
E4 sweeps beside the zoo's generators.

- :func:`pull_to_class_means` (*simulated*): real rows pulled toward their class means,
  :math:`x' = \mu_c + \tau\,(x - \mu_c)`; :math:`\tau = 1` is the data itself.
- :func:`fitted_samples` (*fitted*): draws from each client's Gaussian with its covariance
  scaled by s, Theorem 2's own setting on the clients' statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["pull_to_class_means", "fitted_samples"]


def pull_to_class_means(features: np.ndarray, labels: np.ndarray, tau: float) -> np.ndarray:
    """:math:`x' = \\mu_c + \\tau (x - \\mu_c)` for each row of class c, float64."""
    x = np.asarray(features, dtype=np.float64)
    labels = np.asarray(labels)
    if labels.shape != (len(x),):
        raise ValueError(f"labels: expected {len(x)} labels, got shape {labels.shape}")
    if not tau >= 0:
        raise ValueError(f"tau: expected >= 0, got {tau!r}")
    out = np.empty_like(x)
    for c in np.unique(labels):
        rows = labels == c
        mean = x[rows].mean(axis=0)
        out[rows] = mean + tau * (x[rows] - mean)
    return out


def fitted_samples(
    clients: Sequence[np.ndarray],
    scales: Sequence[float],
    *,
    n_samples: int,
    seed: int,
    weights: str = "size",
) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    r"""Draws of the fitted family at each covariance scale ``s``: client i's share
    :math:`\lambda_i` of ``n_samples`` rows (largest remainders) from
    :math:`N(\mu_i, s\,C_i)`, :math:`\mu_i, C_i` the mean and covariance (ddof=1) of
    its rows :math:`X_i`, drawn as :math:`\mu_i + \sqrt{s}\,(X_i - \mu_i)^\top z /
    \sqrt{n_i - 1}`, :math:`z \sim N(0, I_{n_i})`: exactly that Gaussian, with no
    factorisation of :math:`C_i` (singular when :math:`n_i \le d`). Every scale uses
    the same ``z`` (``numpy.random.default_rng(seed)``). Returns scale -> (features
    float32 (n_samples, d), client index of each row)."""
    from distrank.clients import client_weights

    if any(not s >= 0 for s in scales):
        raise ValueError(f"scales: expected numbers >= 0, got {list(scales)}")
    sizes = [len(c) for c in clients]
    if min(sizes, default=0) < 2:
        raise ValueError(f"clients: each needs at least 2 rows, got sizes {sizes}")
    counts = _shares(client_weights(sizes, weights), n_samples)
    rng = np.random.default_rng(seed)
    parts: dict[float, list[np.ndarray]] = {float(s): [] for s in scales}
    for rows, count in zip(clients, counts):
        rows = np.asarray(rows, dtype=np.float64)
        mean = rows.mean(axis=0)
        noise = rng.standard_normal((count, len(rows))) @ (rows - mean) / np.sqrt(len(rows) - 1)
        for s, part in parts.items():
            part.append((mean + np.sqrt(s) * noise).astype(np.float32))
    labels = np.repeat(np.arange(len(clients)), counts)
    return {s: (np.concatenate(part), labels) for s, part in parts.items()}


def _shares(weights: np.ndarray, n: int) -> np.ndarray:
    """``n`` split in proportion to ``weights`` (largest remainders, ties to the first)."""
    exact = np.asarray(weights, dtype=np.float64) * n
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: n - counts.sum()]] += 1
    return counts
