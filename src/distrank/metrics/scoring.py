"""Score many models against client-split reference data, in both aggregations, in one pass.

For each model and metric D the table holds

    all     D(pooled reference X, Y)                      (centralized evaluation)
    avg     sum_i lambda_i D(X_i, Y),  lambda_i = n_i / n  (or 1 / k: ``weights="uniform"``)
    client  D(X_i, Y) for each client i

(Wang et al., "Consistent Distributed Ranking of Generative Models via Kernel
Distances", arXiv 2310.11714). KD comes from one set of kernel block sums
(``kd.kernel_sums``), FD_all from the clients' Gaussian statistics
(``fd.pool_stats``), and Precision/Recall/Density/Coverage from ``prdc.prdc``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from distrank._backend import (
    as_features,
    check_metrics,
    client_groups,
    resolve_device,
    work_dtype,
)
from distrank.metrics import kd as kd_
from distrank.metrics.fd import frechet_distances, gaussian_stats, pool_stats
from distrank.metrics.kernels import make_kernel, median_bandwidth, needs_bandwidth
from distrank.metrics.prdc import METRICS as PRDC_METRICS
from distrank.metrics.prdc import prdc

METRICS = ("kd", "fd") + PRDC_METRICS
COLUMNS = ["model", "metric", "aggregation", "client", "value"]


def score(reference, clients, models: Mapping[str, object], *,
          metrics: Sequence[str] = METRICS, kernel: str = "poly", kernel_params=None,
          kd_estimator: str = "unbiased", n_subsets: int = 100, subset_size: int = 1000,
          seed: int = 0, weights: str = "size", pr_k: int = 3, dc_k: int = 5,
          dtype: str = "float32", device=None, block_size: int = kd_.BLOCK_SIZE,
          ) -> pd.DataFrame:
    """Every metric of every model: pooled (``all``), client average (``avg``), per client.

    Args:
        reference: (n, d) numpy or torch array of reference features.
        clients: (n,) client label (int or str) of each reference row.
        models: model name -> (m, d) array of generated features.
        metrics: a subset of ``("kd", "fd", "precision", "recall", "density", "coverage")``.
        kernel: KD kernel, ``"poly"``, ``"rbf"``, ``"laplace"`` or ``"linear"``.
        kernel_params: kernel parameters (see ``kernels.make_kernel``); an rbf/laplace
            bandwidth not given is the median heuristic on the pooled reference.
        kd_estimator: ``"unbiased"`` (U-statistic), ``"biased"`` (V-statistic), both on
            the full samples, or ``"subsets"`` (KID: ``n_subsets`` x ``subset_size``,
            ``seed``; adds ``kd_std`` rows for ``all`` and each client).
        weights: lambda_i of ``avg``: ``"size"`` (n_i / n) or ``"uniform"`` (1 / k).
        pr_k: k of Precision and Recall; dc_k: k of Density and Coverage.
        dtype: KD and PRDC products in ``"float32"`` (sums in float64) or
            ``"float64"``; FD statistics are always float64.
        device: torch device (``None``: CUDA if available, else CPU).
        block_size: rows of one kernel block (memory: block_size^2 numbers).

    Returns:
        A DataFrame with columns model, metric, aggregation (``all``, ``avg``,
        ``client``), client (``str(label)``; ``""`` unless aggregation is
        ``client``) and value.

    Raises:
        ValueError: naming the argument and the problem (non-finite features,
            mismatched dimensions, too few rows, unknown metric or option).
    """
    wanted = check_metrics(metrics, METRICS)
    work_dtype(dtype)
    dev = resolve_device(device)
    x = as_features(reference, "reference")
    groups = client_groups(clients, x.shape[0])
    lam = groups.weights(weights)
    ys = _check_models(models, x.shape[1])
    if "kd" in wanted:
        kd_.check_sizes(_client_sizes(groups) | _model_sizes(ys), kd_estimator, subset_size)
        if needs_bandwidth(kernel, kernel_params):
            kernel_params = {**(kernel_params or {}),
                             "bandwidth": median_bandwidth(x, kernel=kernel, seed=seed)}
        kern = make_kernel(kernel, kernel_params, x.shape[1])
    if "fd" in wanted:
        for name, rows in (_client_sizes(groups) | _model_sizes(ys)).items():
            if rows < 2:
                raise ValueError(f"{name} has {rows} row; FD (covariance, ddof=1) needs 2")
    prdc_wanted = [m for m in wanted if m in PRDC_METRICS]
    _check_prdc_sizes(groups, ys, prdc_wanted, pr_k, dc_k)  # before any heavy work

    values: dict[str, dict[str, tuple[float, np.ndarray]]] = {g: {} for g in ys}
    if "kd" in wanted and kd_estimator != "subsets":
        sums = kd_.kernel_sums(x, groups.index, ys.values(), kern, dtype=dtype, device=dev,
                               block_size=block_size)
        per_client, pooled = sums.kd(kd_estimator)
        for g, name in enumerate(ys):
            values[name]["kd"] = (float(pooled[g]), per_client[g])
    elif "kd" in wanted:
        parts = [x] + [x[torch.from_numpy(groups.rows(c))] for c in range(len(groups.sizes))]
        for name, y in ys.items():
            runs = np.array([kd_.kd_subsets(p, y, kern, n_subsets=n_subsets,
                                            subset_size=subset_size, seed=seed,
                                            dtype=dtype, device=dev) for p in parts])
            values[name]["kd"] = (runs[0, 0], runs[1:, 0])
            values[name]["kd_std"] = (runs[0, 1], runs[1:, 1])
    if "fd" in wanted:
        stats = [gaussian_stats(x[torch.from_numpy(groups.rows(c))], device=dev)
                 for c in range(len(groups.sizes))]
        model_stats = [gaussian_stats(y, device=dev) for y in ys.values()]
        fd = frechet_distances(stats + [pool_stats(stats)], model_stats, device=dev)
        for g, name in enumerate(ys):
            values[name]["fd"] = (float(fd[-1, g]), fd[:-1, g])
    if prdc_wanted:
        result = prdc(x, clients, ys, pr_k=pr_k, dc_k=dc_k, metrics=prdc_wanted,
                      dtype=dtype, device=dev)
        for name in ys:
            for metric in prdc_wanted:
                by_client = result[name][metric]
                local = np.array([by_client[c] for c in groups.names])
                values[name][metric] = (float(by_client["all"]), local)
    return _table(values, groups.names, lam)


def client_scores(client_features, model_features, *, metrics: Sequence[str] = METRICS,
                  kernel: str = "poly", kernel_params=None, kd_estimator: str = "unbiased",
                  n_subsets: int = 100, subset_size: int = 1000, seed: int = 0,
                  pr_k: int = 3, dc_k: int = 5, dtype: str = "float32", device=None,
                  block_size: int = kd_.BLOCK_SIZE) -> dict[str, float]:
    """One client's scores of one model: what a client computes without sharing data.

    Same options as ``score``; the result maps each metric (and ``kd_std`` in
    subsets mode) to its value, equal to that client's ``client`` rows of
    ``score``. An rbf/laplace kernel needs an explicit ``kernel_params["bandwidth"]``:
    the bandwidth must be the same for all clients (computed once, e.g. with
    ``median_bandwidth`` on pooled or public data), never a client's own median.
    """
    wanted = check_metrics(metrics, METRICS)
    if "kd" in wanted and needs_bandwidth(kernel, kernel_params):
        raise ValueError(f"kernel_params: kernel {kernel!r} needs an explicit 'bandwidth' for "
                         "client scores (one bandwidth shared by all clients)")
    x = as_features(client_features, "client_features")
    table = score(x, np.zeros(x.shape[0], dtype=np.int64), {"model": model_features},
                  metrics=wanted, kernel=kernel, kernel_params=kernel_params,
                  kd_estimator=kd_estimator, n_subsets=n_subsets, subset_size=subset_size,
                  seed=seed, pr_k=pr_k, dc_k=dc_k, dtype=dtype, device=device,
                  block_size=block_size)
    pooled = table[table.aggregation == "all"]
    return {row.metric: float(row.value) for row in pooled.itertuples()}


def _check_models(models, d: int) -> dict[str, torch.Tensor]:
    if not isinstance(models, Mapping) or not models:
        raise ValueError("models: expected a non-empty mapping of name -> (m, d) array")
    ys = {}
    for name, y in models.items():
        y = as_features(y, f"models[{name!r}]")
        if y.shape[1] != d:
            raise ValueError(f"models[{name!r}]: dimension {y.shape[1]} does not match "
                             f"the reference dimension {d}")
        ys[str(name)] = y
    if len(ys) != len(models):
        raise ValueError("models: names are not distinct as strings")
    return ys


def _check_prdc_sizes(groups, ys, wanted, pr_k: int, dc_k: int) -> None:
    """k-NN radii need k + 1 rows: clients for precision (pr_k), density and coverage
    (dc_k); models for recall (pr_k)."""
    for k, name in ((pr_k, "pr_k"), (dc_k, "dc_k")):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"{name}: expected a positive integer, got {k!r}")
    needs = {f"clients: client {c!r}": ([pr_k] if "precision" in wanted else [])
             + ([dc_k] if {"density", "coverage"} & set(wanted) else []) for c in groups.names}
    sizes = _client_sizes(groups)
    if "recall" in wanted:
        needs |= {name: [pr_k] for name in _model_sizes(ys)}
        sizes |= _model_sizes(ys)
    for name, ks in needs.items():
        if ks and sizes[name] < max(ks) + 1:
            raise ValueError(f"{name} has {sizes[name]} rows; k={max(ks)} nearest neighbours "
                             f"need at least {max(ks) + 1}")


def _client_sizes(groups) -> dict[str, int]:
    return {f"clients: client {name!r}": int(size)
            for name, size in zip(groups.names, groups.sizes)}


def _model_sizes(ys) -> dict[str, int]:
    return {f"models[{name!r}]": y.shape[0] for name, y in ys.items()}


def _table(values, client_names: list[str], lam: np.ndarray) -> pd.DataFrame:
    rows = []
    for model, by_metric in values.items():
        for metric, (pooled, local) in by_metric.items():
            rows.append((model, metric, "all", "", pooled))
            if metric != "kd_std":  # a std of the average is not the average of stds
                rows.append((model, metric, "avg", "", float(lam @ local)))
            rows += [(model, metric, "client", c, float(v)) for c, v in zip(client_names, local)]
    return pd.DataFrame(rows, columns=COLUMNS)
