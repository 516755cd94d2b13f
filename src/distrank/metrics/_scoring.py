"""Score many models against client-split reference data, in both aggregations, in one pass.

For each model and metric D the table holds

    all     D(pooled reference X, Y)                      (centralized evaluation)
    avg     sum_i lambda_i D(X_i, Y),  lambda_i = n_i / n  (or 1 / k: ``weights="uniform"``)
    client  D(X_i, Y) for each client i

(Wang et al., "Consistent Distributed Ranking of Generative Models via Kernel
Distances", arXiv 2310.11714). Every metric is computed by its family
(``metrics._registry``: KD from one set of kernel block sums, FD_all from the clients'
Gaussian statistics, Precision/Recall/Density/Coverage from one blocked pass), given
the inputs :func:`prepare` checks; when one family forms every product another's
kernel sums need (PRDC's distance blocks, KD's sums), those products serve both: the
same values bit for bit, without KD's GEMMs. Every check runs before any heavy work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
import torch

from distrank._arrays import as_features, check_models, product_rows, resolve_device, work_dtype
from distrank._checks import about
from distrank.clients import client_groups
from distrank.metrics import _registry
from distrank.metrics._family import Inputs, Run, Values
from distrank.metrics._kernels import make_kernel, median_bandwidth, needs_bandwidth
from distrank.metrics._options import ScoreOptions, score_options
from distrank.metrics._registry import METRICS, uses_kernel
from distrank.metrics._table import from_values
from distrank.metrics.kd._sums import SumsBuilder


def prepare(
    reference,
    clients,
    models: Mapping[str, object],
    options: ScoreOptions,
    *,
    device=None,
    block_size: int | None = None,
    median: bool = True,
) -> Inputs:
    """The checked inputs of every scoring call: the reference's rows and client groups
    (``clients``: each row's label, or a mapping of partition name -> labels), the
    models' rows, the rows every requested metric needs in each client and model
    (``TooFewRows`` names the sample), and KD's kernel with an rbf/laplace bandwidth
    not given resolved by the median heuristic on the pooled reference (in ``options``
    too; ``median`` False: refused, see :func:`kernel_of`). A bad input is a
    ``ValueError`` naming it."""
    with about("reference"):
        x = as_features(reference, "reference")
        if not isinstance(clients, Mapping):
            partitions = {"": client_groups(clients, x.shape[0])}
    ys = check_models(models, x.shape[1])
    if not isinstance(clients, Mapping):
        check_rows(partitions[""], ys, options)
    elif not clients:
        raise ValueError("partitions: expected a non-empty mapping of name -> (n,) labels")
    else:
        partitions = {}
        for name, labels in clients.items():
            try:
                partitions[str(name)] = client_groups(labels, x.shape[0])
                check_rows(partitions[str(name)], ys, options)
            except ValueError as err:
                raise type(err)(f"partitions[{name!r}]: {err}") from None
    kernel, options = kernel_of(x, options, median=median)
    block = product_rows(block_size, work_dtype(options.dtype).itemsize)
    return Inputs(x, partitions, ys, options, kernel, resolve_device(device), block)


def kernel_of(x: torch.Tensor, options: ScoreOptions, *, median: bool = True):
    """(KD's kernel or None when no requested metric uses it, ``options`` with an
    rbf/laplace bandwidth not given set by the median heuristic on ``x``). ``median``
    False (a client's scores): such a bandwidth is a ValueError, since every client must
    use one bandwidth (computed once, on pooled or public data), never its own median."""
    if not uses_kernel(options.metrics):
        return None, options
    params = options.kernel_params
    if needs_bandwidth(options.kernel, params):
        if not median:
            raise ValueError(
                f"kernel_params: kernel {options.kernel!r} needs an explicit 'bandwidth' for "
                "client scores (one bandwidth shared by all clients)"
            )
        with about("reference"):
            bandwidth = median_bandwidth(x, kernel=options.kernel, seed=options.seed)
        options = options.replace(kernel_params={**(params or {}), "bandwidth": bandwidth})
    return make_kernel(options.kernel, options.kernel_params, x.shape[1]), options


def check_rows(groups, models: Mapping, options: ScoreOptions) -> None:
    """TooFewRows naming the sample unless every client of ``groups`` and every model
    holds the rows each metric of ``options`` needs (``_registry.check_rows``)."""
    sizes = {("client", name): int(n) for name, n in zip(groups.names, groups.sizes)}
    _registry.check_rows(sizes | {("model", n): y.shape[0] for n, y in models.items()}, options)


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

    Parameters
    ----------
    reference
        (n, d) numpy or torch array of reference features.
    clients
        (n,) client label (int or str) of each reference row.
    models
        model name -> (m, d) array of generated features.
    options
        the :class:`~distrank.metrics.ScoreOptions` (metrics, kernel,
        estimator, weights, k of PRDC, dtype; None: the defaults), or a mapping of
        them; ``changes`` (option names as keywords) override them. The
        ``"subsets"`` estimator adds ``kd_std`` rows for ``all`` and each client.
    device
        torch device (``None``: CUDA if available, else CPU).
    block_size
        rows of one product block, KD's and PRDC's (``None``: 64 MiB
        blocks, 4096 rows in float32, 2816 in float64).

    Returns
    -------
    pandas.DataFrame
        The columns of ``COLUMNS``: model, metric,
        aggregation (``all``, ``avg``, ``client``), client (``str(label)``; ``""``
        unless aggregation is ``client``) and value; ``attrs["kernel_params"]``: the
        kernel's parameters as used (a median-heuristic bandwidth resolved).

    Raises
    ------
    ValueError
        naming the argument and the problem (non-finite features,
        mismatched dimensions, too few rows, unknown metric or option).
    """
    opts = score_options(options, **changes)  # the one normalisation of a scoring call
    inputs = prepare(reference, clients, models, opts, device=device, block_size=block_size)
    table = table_of(inputs)
    table.attrs["kernel_params"] = dict(inputs.options.kernel_params or {})  # as resolved
    return table


def by_family(metrics: Sequence[str]) -> dict:
    """Each family of ``metrics`` (keys) -> its keys among them, in the asked order."""
    out: dict = {}
    for key in metrics:
        out.setdefault(METRICS[key].family, []).append(key)
    return out


def table_of(inputs: Inputs) -> pd.DataFrame:
    """The score table of prepared ``inputs`` (one partition): every family's plain path."""
    groups = inputs.groups
    return from_values(values_of(inputs), groups.names, groups.weights(inputs.options.weights))


def pooled_of(inputs: Inputs) -> dict[str, dict[str, float]]:
    """model -> output key -> the pooled value (``all``) of prepared ``inputs``, the families
    asked for nothing else (``Inputs.per_client`` False: no client values where a family
    can spare them); each value that of :func:`table_of`'s ``all`` row, bit for bit."""
    values = values_of(replace(inputs, per_client=False))
    return {
        name: {m: float(v[0]) for m, v in by_metric.items() if v[0] is not None}
        for name, by_metric in values.items()
    }


def values_of(inputs: Inputs) -> Values:
    """The ``Values`` of prepared ``inputs`` (one partition):
    every family's plain path, the outputs of each model in the asked order."""
    opts = inputs.options
    runs = [f.plain(inputs, keys) for f, keys in by_family(opts.metrics).items()]  # checks first
    values: Values = {name: {} for name in inputs.models}
    for run in share_products(runs):
        for name, by_metric in run.compute().items():
            values[name] |= by_metric
    order = [m for key in opts.metrics for m in (key, *METRICS[key].spreads)]  # the asked order
    return {name: {m: v[m] for m in order if m in v} for name, v in values.items()}


def share_products(runs: Sequence[Run]) -> list[Run]:
    """The runs, a run that feeds products and one that takes its sums from them made
    one: the feeder's pass hands its product blocks to a ``kd._sums.SumsBuilder`` of the
    taker's kernel, whose sums give the taker's values (bit for bit those of its own
    pass: the same blocks in the same order), so the taker forms no product itself."""
    feeder = next((r for r in runs if r.feeds_products), None)
    taker = next((r for r in runs if r.from_sums is not None), None)
    if feeder is None or taker is None:
        return list(runs)

    def both() -> Values:
        builder = SumsBuilder(taker.kernel)
        values = feeder.compute(products=builder)
        for name, by_metric in taker.from_sums(builder.sums()).items():
            values[name] |= by_metric
        return values

    return [r for r in runs if r is not feeder and r is not taker] + [Run(both)]


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

    Equal to that client's ``client`` rows of :func:`score`: the client's rows scored
    as one pool (``pooled_of``, no table).

    Parameters
    ----------
    client_features : array_like, shape (n, d)
        The client's rows.
    models : mapping
        Model name -> (m, d) array of generated features.
    options : ScoreOptions, mapping or None
        Those of :func:`score` (``weights`` does not matter for one client). An
        rbf/laplace kernel needs an explicit ``kernel_params["bandwidth"]``, the same
        for all clients (computed once, e.g. with ``median_bandwidth`` on pooled or
        public data), never a client's own median.
    device : str or torch.device, optional
        Where the products run (None: CUDA if available, else the CPU).
    block_size : int, optional
        Rows of one product block (None: 64 MiB blocks).
    **changes
        Option names as keywords, which win over ``options``.

    Returns
    -------
    dict
        Model name -> {metric: value} (and ``kd_std`` in subsets mode).
    """
    opts = score_options(options, **changes)  # the one normalisation of a client's call
    x = as_features(client_features, "client_features")
    one = np.zeros(x.shape[0], dtype=np.int64)  # the client's rows: one pool
    inputs = prepare(x, one, models, opts, device=device, block_size=block_size, median=False)
    return pooled_of(inputs)


def client_scores(client_features, model_features, options=None, **changes) -> dict[str, float]:
    """One client's scores of one model: :func:`score_client` with a single model.

    Parameters
    ----------
    client_features : array_like, shape (n, d)
    model_features : array_like, shape (m, d)
    options, **changes
        Those of :func:`score_client`.

    Returns
    -------
    dict
        Metric -> value.
    """
    return score_client(client_features, {"model": model_features}, options, **changes)["model"]
