"""Score many models against client-split reference data, in both aggregations, in one pass.

For each model and metric D the table holds

    all     D(pooled reference X, Y)                      (centralized evaluation)
    avg     sum_i lambda_i D(X_i, Y),  lambda_i = n_i / n  (or 1 / k: ``weights="uniform"``)
    client  D(X_i, Y) for each client i

(Wang et al., "Consistent Distributed Ranking of Generative Models via Kernel
Distances", arXiv 2310.11714). KD comes from one set of kernel block sums
(``kd.kernel_sums``), FD_all from the clients' Gaussian statistics
(``fd.pool_stats``), and Precision/Recall/Density/Coverage from ``prdc.prdc``.
When PRDC's pass forms every product KD needs, KD's sums come from those products
(``kd.SumsBuilder``): the same values bit for bit, without KD's GEMMs.

The scorer dispatches through ``metrics.registry``: a metric's compute function
takes the checked inputs (:class:`Inputs`) and the requested metric keys it
serves, checks what it needs, and returns a function that computes
``{model: {metric: (pooled value, per-client values)}}``; every check runs before
any heavy work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from distrank._arrays import as_features, resolve_device, work_dtype
from distrank._checks import TooFewRows, about
from distrank.clients import ClientGroups, client_groups
from distrank.metrics import kd as kd_
from distrank.metrics.fd import frechet_distances, gaussian_stats, pool_stats
from distrank.metrics.kernels import make_kernel, median_bandwidth, needs_bandwidth
from distrank.metrics.options import ScoreOptions, score_options
from distrank.metrics.prdc import _check_block, prdc
from distrank.metrics.registry import METRICS
from distrank.metrics.subsets import subset_kd
from distrank.metrics.table import from_values

Values = dict[str, dict[str, tuple[float, np.ndarray]]]
#: Bytes of model covariances FD holds at once (models are scored in chunks of this).
FD_CHUNK_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Inputs:
    """The checked inputs of one scoring call, as the compute functions get them."""

    reference: torch.Tensor
    groups: ClientGroups
    models: dict[str, torch.Tensor]
    options: ScoreOptions
    device: torch.device
    block_size: int = kd_.BLOCK_SIZE  # rows of one product block, KD's and PRDC's

    def client_rows(self, c: int) -> torch.Tensor:
        return self.reference[torch.from_numpy(self.groups.rows(c))]

    def sizes(self, *, models: bool = True) -> dict[str, int]:
        """Rows of every client (and model), keyed by how an error names them."""
        return {key: rows for key, (rows, _) in self._named(models).items()}

    def subject(self, key: str) -> tuple[str, str]:
        """The ``InputError.subject`` of a key of :meth:`sizes`."""
        return self._named(True)[key][1]

    def _named(self, models: bool) -> dict[str, tuple[int, tuple[str, str]]]:
        out = {
            f"clients: client {name!r}": (int(size), ("client", name))
            for name, size in zip(self.groups.names, self.groups.sizes)
        }
        if models:
            out |= {
                f"models[{name!r}]": (y.shape[0], ("model", name))
                for name, y in self.models.items()
            }
        return out


def score(
    reference,
    clients,
    models: Mapping[str, object],
    options: ScoreOptions | Mapping | None = None,
    *,
    device=None,
    block_size: int | None = None,
    **changes,
) -> pd.DataFrame:
    """Every metric of every model: pooled (``all``), client average (``avg``), per client.

    Args:
        reference: (n, d) numpy or torch array of reference features.
        clients: (n,) client label (int or str) of each reference row.
        models: model name -> (m, d) array of generated features.
        options: the :class:`~distrank.metrics.options.ScoreOptions` (metrics, kernel,
            estimator, weights, k of PRDC, dtype; None: the defaults), or a mapping of
            them; ``changes`` (option names as keywords) override them. The
            ``"subsets"`` estimator adds ``kd_std`` rows for ``all`` and each client.
        device: torch device (``None``: CUDA if available, else CPU).
        block_size: rows of one product block, KD's and PRDC's (``None``: 64 MiB
            blocks, 4096 rows in float32, 2816 in float64).

    Returns:
        A DataFrame with the columns of :data:`distrank.metrics.table.COLUMNS`: model,
        metric, aggregation (``all``, ``avg``, ``client``), client (``str(label)``;
        ``""`` unless aggregation is ``client``) and value.

    Raises:
        ValueError: naming the argument and the problem (non-finite features,
            mismatched dimensions, too few rows, unknown metric or option).
    """
    opts = score_options(options, **changes)
    with about("reference"):
        x = as_features(reference, "reference")
        groups = client_groups(clients, x.shape[0])
    lam = groups.weights(opts.weights)
    inputs = Inputs(
        x,
        groups,
        _check_models(models, x.shape[1]),
        opts,
        resolve_device(device),
        _check_block(block_size, work_dtype(opts.dtype).itemsize),
    )
    wanted = opts.metrics
    by_function: dict[Callable, list[str]] = {}
    for key in wanted:
        by_function.setdefault(METRICS[key].function(), []).append(key)
    runs = {fn: fn(inputs, keys) for fn, keys in by_function.items()}  # all checks first
    _share_products(runs, by_function.get(_score_prdc, []))
    values: Values = {name: {} for name in inputs.models}
    for run in runs.values():
        for name, by_metric in run().items():
            values[name] |= by_metric
    order = [m for key in wanted for m in (key, f"{key}_std")]  # rows in the asked order
    values = {name: {m: v[m] for m in order if m in v} for name, v in values.items()}
    return from_values(values, groups.names, lam)


def _share_products(runs: dict[Callable, Callable], prdc_keys: list[str]) -> None:
    """Let PRDC's pass give KD its sums when it forms every product KD needs (the
    pooled radii and the model radii): KD then costs no GEMM of its own, and its
    values are bit for bit those of its own pass (the same blocks in the same order).
    """
    kd_run, prdc_run = runs.get(_score_kd), runs.get(_score_prdc)
    if kd_run is None or prdc_run is None or kd_run.kernel is None:
        return
    if "recall" not in prdc_keys or prdc_keys == ["recall"]:
        return

    def both() -> Values:
        builder = kd_.SumsBuilder(kd_run.kernel)
        values = prdc_run(products=builder)
        for name, kd in kd_run.values(builder.sums()).items():
            values[name] |= kd
        return values

    del runs[_score_kd]
    runs[_score_prdc] = both


def _score_kd(inputs: Inputs, keys: list[str]) -> Callable[[], Values]:
    """KD from one set of kernel block sums (U or V form), or KID-style subsets."""
    o, x, groups = inputs.options, inputs.reference, inputs.groups
    estimator = o.kd_estimator
    kd_.check_sizes({}, estimator, o.subset_size)
    for key, rows in inputs.sizes().items():
        with about(*inputs.subject(key)):
            kd_.check_sizes({key: rows}, estimator, o.subset_size)
    params = o.kernel_params
    if needs_bandwidth(o.kernel, params):
        with about("reference"):
            bandwidth = median_bandwidth(x, kernel=o.kernel, seed=o.seed)
        params = {**(params or {}), "bandwidth": bandwidth}
    kern = make_kernel(o.kernel, params, x.shape[1])

    def values(sums: kd_.KernelSums) -> Values:
        per_client, pooled = sums.kd(estimator)
        return {
            name: {"kd": (float(pooled[g]), per_client[g])} for g, name in enumerate(inputs.models)
        }

    def run() -> Values:
        if estimator != "subsets":
            return values(
                kd_.kernel_sums(
                    x,
                    groups.index,
                    inputs.models.values(),
                    kern,
                    dtype=o.dtype,
                    device=inputs.device,
                    block_size=inputs.block_size,
                )
            )
        mean, std = subset_kd(
            x,
            groups.index,
            list(inputs.models.values()),
            kern,
            n_subsets=o.n_subsets,
            subset_size=o.subset_size,
            seed=o.seed,
            dtype=o.dtype,
            device=inputs.device,
            block_size=inputs.block_size,
        )
        return {
            name: {"kd": (mean[g, 0], mean[g, 1:]), "kd_std": (std[g, 0], std[g, 1:])}
            for g, name in enumerate(inputs.models)
        }

    # What PRDC's pass needs to give KD its sums (_share_products): full-sample KD only.
    run.kernel, run.values = (kern if estimator != "subsets" else None), values
    return run


def _score_fd(inputs: Inputs, keys: list[str]) -> Callable[[], Values]:
    """FD per client, and FD_all from the pooled client statistics."""
    for name, rows in inputs.sizes().items():
        if rows < 2:
            raise TooFewRows(
                f"{name} has {rows} row; FD (covariance, ddof=1) needs 2",
                subject=inputs.subject(name),
            )

    def run() -> Values:
        # Models in chunks of FD_CHUNK_BYTES of covariances; per chunk, one client's
        # (d, d) statistics at a time, pooled as they come: memory holds a chunk of
        # models' and two clients' covariances, whatever the numbers of clients and models.
        dev, k, names = inputs.device, len(inputs.groups.sizes), list(inputs.models)
        d = next(iter(inputs.models.values())).shape[1]
        chunk = max(1, FD_CHUNK_BYTES // (8 * d * d))
        fd = np.empty((k + 1, len(names)))
        for start in range(0, len(names), chunk):
            cols = slice(start, start + chunk)
            model_stats = [gaussian_stats(inputs.models[n], device=dev) for n in names[cols]]
            pooled = None
            for c in range(k):
                stats = gaussian_stats(inputs.client_rows(c), device=dev)
                fd[c, cols] = frechet_distances([stats], model_stats, device=dev)[0]
                pooled = stats if pooled is None else pool_stats([pooled, stats])
            fd[k, cols] = frechet_distances([pooled], model_stats, device=dev)[0]
        return {name: {"fd": (float(fd[-1, g]), fd[:-1, g])} for g, name in enumerate(names)}

    return run


def _score_prdc(inputs: Inputs, keys: list[str]) -> Callable[[], Values]:
    """Precision, Recall, Density and Coverage in one blocked pass (``prdc.prdc``)."""
    o, groups = inputs.options, inputs.groups
    pr_k, dc_k = o.pr_k, o.dc_k
    # k-NN radii need k + 1 rows: clients for precision (pr_k), density and coverage
    # (dc_k); models for recall (pr_k).
    client_k = ([pr_k] if "precision" in keys else []) + (
        [dc_k] if {"density", "coverage"} & set(keys) else []
    )
    needs = {name: client_k for name in inputs.sizes(models=False)}
    if "recall" in keys:
        needs |= {f"models[{name!r}]": [pr_k] for name in inputs.models}
    sizes = inputs.sizes()
    for name, ks in needs.items():
        if ks and sizes[name] < max(ks) + 1:
            raise TooFewRows(
                f"{name} has {sizes[name]} rows; k={max(ks)} nearest neighbours "
                f"need at least {max(ks) + 1}",
                subject=inputs.subject(name),
            )

    def run(products=None) -> Values:
        result = prdc(
            inputs.reference,
            groups.index,
            inputs.models,
            pr_k=pr_k,
            dc_k=dc_k,
            metrics=keys,
            dtype=o.dtype,
            device=inputs.device,
            block_rows=inputs.block_size,
            products=products,
        )
        return {
            name: {
                metric: (
                    float(result[name][metric]["all"]),
                    np.array([result[name][metric][str(c)] for c in range(len(groups.names))]),
                )
                for metric in keys
            }
            for name in inputs.models
        }

    return run


def score_client(
    client_features,
    models: Mapping[str, object],
    options: ScoreOptions | Mapping | None = None,
    *,
    device=None,
    block_size: int | None = None,
    **changes,
) -> dict[str, dict[str, float]]:
    """One client's scores of every model: what a client computes without sharing data.

    ``options``, ``changes``, ``device`` and ``block_size`` are those of :func:`score`
    (``weights`` does not matter for one client); the result maps each model to
    ``{metric: value}`` (and ``kd_std`` in subsets mode), equal to that client's
    ``client`` rows of ``score``. An rbf/laplace kernel needs an explicit
    ``kernel_params["bandwidth"]``: the bandwidth must be the same for all clients
    (computed once, e.g. with ``median_bandwidth`` on pooled or public data), never a
    client's own median.
    """
    opts = score_options(options, **changes)
    if "kd" in opts.metrics and needs_bandwidth(opts.kernel, opts.kernel_params):
        raise ValueError(
            f"kernel_params: kernel {opts.kernel!r} needs an explicit 'bandwidth' for "
            "client scores (one bandwidth shared by all clients)"
        )
    x = as_features(client_features, "client_features")
    table = score(
        x, np.zeros(x.shape[0], dtype=np.int64), models, opts, device=device, block_size=block_size
    )
    pooled = table[table.aggregation == "all"]
    out: dict[str, dict[str, float]] = {}
    for row in pooled.itertuples():
        out.setdefault(row.model, {})[row.metric] = float(row.value)
    return out


def client_scores(client_features, model_features, options=None, **changes) -> dict[str, float]:
    """One client's scores of one model (:func:`score_client` with a single model)."""
    return score_client(client_features, {"model": model_features}, options, **changes)["model"]


def _check_models(models, d: int) -> dict[str, torch.Tensor]:
    if not isinstance(models, Mapping) or not models:
        raise ValueError("models: expected a non-empty mapping of name -> (m, d) array")
    ys = {}
    for name, y in models.items():
        with about("model", str(name)):
            y = as_features(y, f"models[{name!r}]")
            if y.shape[1] != d:
                raise ValueError(
                    f"models[{name!r}]: dimension {y.shape[1]} does not match "
                    f"the reference dimension {d}"
                )
        ys[str(name)] = y
    if len(ys) != len(models):
        raise ValueError("models: names are not distinct as strings")
    return ys
