r"""Bootstrap confidence intervals for scores, score differences and Kendall tau(avg, all).

**Resampling.** Each client's reference rows are drawn with replacement within the
client (n_i rows), and each model's generated rows from that model (m_g rows), all
independently: the k + M samples of ``scipy.stats.bootstrap`` with ``paired=False``,
applied to row indices. A resample is scored exactly as the data are (same
kernel, bandwidth included, same weights); intervals are **percentile** intervals
(``method="percentile"``). BCa is not offered: its jackknife needs n + sum_g m_g
further statistics, one per left-out row.

**KD by re-weighting.** With :math:`c_r` the number of times reference row r is
drawn and :math:`v_j` the number of times row j of model g is, the kernel block sums
of the resample are quadratic and bilinear forms of the full-sample kernel blocks,

.. math::
    S^*_{X_a X_b} = \sum_{r \in a,\, s \in b} c_r c_s\, k(x_r, x_s), \qquad
    S^*_{X_a Y} = \sum_{r \in a,\, j} c_r v_j\, k(x_r, y_j),

and likewise :math:`S^*_{YY}`. Every kernel block is formed once and contracted with
all B count vectors at once (one GEMM), and the resample's
:class:`~distrank.metrics.kd.KernelSums` gives its KD for every client and the pool
through ``KernelSums.kd``. FD and PRDC have no such form: their resamples are
scored afresh by ``metrics.score``.

*V form*: the plug-in estimate of the resample, copies included (exactly the V
statistic of the resampled rows). *U form*: a row's copies are one observation, so
they never pair with each other, and a within-sample sum is rescaled by
:math:`n/(n-1)`:

.. math::
    S^{U*}_{X_a X_a} = \frac{n_a}{n_a - 1} \Big(S^*_{X_a X_a} - \sum_{r \in a} c_r^2\,
    k(x_r, x_r)\Big), \qquad \mathrm{tr}^{U*} = 0,

cross-client blocks and :math:`S^*_{XY}` unchanged. Of the :math:`n(n-1)` ordered pairs
of draws, :math:`(n-1)^2` are expected to hold distinct rows, so the resampled KD is
exactly unbiased for the sample's KD, :math:`E^*[\mathrm{KD}^*] = \mathrm{KD}`, for every
client and the pool. Scoring the resampled rows as they are instead would add about
:math:`(\overline{k(y, y)} - \overline{k(y, y')}) / m` to a model's KD: a bias that
differs between models and, with a polynomial kernel on high-norm features, exceeds
the spread of the differences. FD and PRDC resamples are scored as drawn, copies
included, and both depend on the number of distinct rows (FD's bias falls as 1/n,
Chong and Forsyth, "Effectively Unbiased FID and Inception Score and where to find
them", CVPR 2020; a copy at distance 0 shrinks k-NN radii), which a resample holds
only about 63 % of: their percentile intervals can sit beside the point estimates.

(Efron and Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13 for the
percentile interval; scipy's ``bootstrap`` for the resampling and the quantiles.)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np
import pandas as pd
import torch

from distrank._checks import positive_int
from distrank.clients import ClientGroups
from distrank.metrics._family import Inputs
from distrank.metrics._options import ScoreOptions, score_options
from distrank.metrics._ranking import tau_b
from distrank.metrics._scoring import by_family, prepare, table_of
from distrank.metrics._table import from_values, keyed

#: Aggregations of a score cube, in order (pooled, client average, then each client).
POOLED, AVERAGE = 0, 1


@dataclass(frozen=True)
class ScoreCube:
    """Scores as an array: ``values[..., metric, model, aggregation]``, aggregation 0 =
    ``all``, 1 = ``avg``, 2 + i = client i; a leading axis holds resamples."""

    metrics: tuple[str, ...]
    models: tuple[str, ...]
    clients: tuple[str, ...]
    values: np.ndarray

    @classmethod
    def from_table(cls, table: pd.DataFrame, metrics, models, clients) -> ScoreCube:
        """The cube of one tidy score table (``metrics.score``'s columns)."""
        index = pd.MultiIndex.from_product([metrics, models, ["all", "avg", *clients]])
        values = keyed(table).reindex(index)
        if values.isna().any():
            raise ValueError(f"scores lack {values[values.isna()].index.tolist()[:3]}")
        shape = (len(metrics), len(models), 2 + len(clients))
        return cls(tuple(metrics), tuple(models), tuple(clients), values.to_numpy().reshape(shape))


@dataclass(frozen=True)
class BootstrapScores:
    """The point scores and the bootstrap distribution of a set of statistics of them.

    ``distribution`` and the percentile ``low``/``high`` come from
    ``scipy.stats.bootstrap``. A statistic undefined (NaN) in some resamples, such as
    tau of a constant score vector, gets the same percentile interval over the
    resamples where it is defined; ``n_defined`` counts them.

    Attributes
    ----------
    point
        the ``ScoreCube`` of the data (the point scores): ``values`` (n_metrics, M, 2 + k),
        aggregation 0 = ``all``, 1 = ``avg``, 2 + i = client i.
    distribution
        (n_statistics, B) the statistics of every resample.
    low
        (n_statistics,) lower bound of each statistic's percentile interval.
    high
        (n_statistics,) upper bound of each statistic's percentile interval.
    confidence_level
        confidence level of the intervals, in (0, 1).
    n_defined
        (n_statistics,) the resamples where each statistic is defined (finite).
    """

    point: ScoreCube
    distribution: np.ndarray
    low: np.ndarray
    high: np.ndarray
    confidence_level: float
    n_defined: np.ndarray


def bootstrap_scores(
    reference,
    clients,
    models: Mapping[str, object],
    options: ScoreOptions | Mapping | None = None,
    *,
    summary: Callable[[np.ndarray], np.ndarray],
    n_resamples: int = 1000,
    confidence_level: float = 0.95,
    batch: int | None = None,
    device=None,
    block_size: int | None = None,
    **changes,
) -> BootstrapScores:
    """Percentile intervals of ``summary`` of the score cube, over bootstrap resamples.

    Resamples come from ``scipy.stats.bootstrap(rng=seed)`` (module doc; ``seed`` of
    the options). KD (U or V) is re-weighted; FD and PRDC are scored afresh on each
    resample with :func:`~distrank.metrics.score` (seconds each at n = 5000). An
    rbf/laplace bandwidth not given is the median heuristic on the pooled reference,
    fixed for every resample.

    Parameters
    ----------
    reference
        (n, d) numpy or torch array of reference features.
    clients
        (n,) client label (int or str) of each reference row.
    models
        model name -> (m, d) array of generated features.
    options
        the :class:`~distrank.metrics.ScoreOptions` (None: the defaults), or a mapping
        of them, as in :func:`~distrank.metrics.score`; ``changes`` override them.
    summary
        maps cube values (batch, n_metrics, M, 2 + k) (aggregation 0 = ``all``,
        1 = ``avg``, 2 + i = client i) to statistics (n_statistics, batch) (see
        ``pairwise_summary``, ``flat_summary``).
    n_resamples
        B, the number of bootstrap resamples: an integer >= 1 (default 1000).
    confidence_level
        confidence level of the intervals, in (0, 1) (default 0.95).
    batch
        resamples scored at a time (``None``: all at once); memory: batch x
        (n + sum m) counts, and KD re-forms the kernel blocks once per batch.
    device
        torch device, as in :func:`~distrank.metrics.score` (``None``: CUDA if
        available, else CPU).
    block_size
        rows of one product block, as in :func:`~distrank.metrics.score` (``None``: the
        default blocks).
    **changes
        option names as keywords, overriding ``options``.

    Returns
    -------
    BootstrapScores
        the point score cube, the bootstrap distribution of the statistics and their
        percentile intervals (:class:`~distrank.metrics.BootstrapScores`).

    Raises
    ------
    ValueError
        naming the argument: a bad ``n_resamples`` or ``confidence_level``, a metric
        that cannot be resampled under the options, or a bad input (as
        :func:`~distrank.metrics.score`).
    """
    opts = score_options(options, **changes)
    n_resamples = positive_int(n_resamples, "n_resamples")
    if not 0 < confidence_level < 1:
        raise ValueError(f"confidence_level: expected a number in (0, 1), got {confidence_level!r}")
    for family in by_family(opts.metrics):
        family.check_resample(opts)
    from scipy import stats  # here: `distrank score` imports this module for its defaults

    inputs = prepare(reference, clients, models, opts, device=device, block_size=block_size)
    groups, ys = inputs.groups, inputs.models
    point = ScoreCube.from_table(table_of(inputs), opts.metrics, tuple(ys), tuple(groups.names))
    data = [np.arange(n) for n in groups.sizes] + [np.arange(y.shape[0]) for y in ys.values()]
    with warnings.catch_warnings():  # NaN statistics are handled below
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(
            data,
            _statistic(inputs, point, summary),
            n_resamples=n_resamples,
            batch=batch,
            vectorized=True,
            paired=False,
            confidence_level=confidence_level,
            method="percentile",
            rng=np.random.default_rng(opts.seed),
        )
    return _intervals(point, result, confidence_level)


def _statistic(inputs: Inputs, point: ScoreCube, summary: Callable) -> Callable:
    """The vectorised statistic of ``scipy.stats.bootstrap`` (samples: the drawn row
    indices of every client, then of every model): ``summary`` of the score cube of each
    resample in a batch, by each family's ``resample`` path (KD re-weights), else
    afresh."""
    k, wanted = len(inputs.groups.sizes), inputs.options.metrics

    def statistic(*samples, axis=-1):
        client_draws, model_draws = samples[:k], samples[k:]
        values = np.empty((client_draws[0].shape[0],) + point.values.shape)
        afresh = []
        for family, keys in by_family(wanted).items():
            got = family.resample(inputs, keys, client_draws, model_draws)
            if got is None:
                afresh += keys
            else:
                values[:, [wanted.index(m) for m in keys]] = got
        if afresh:
            values[:, [wanted.index(m) for m in afresh]] = _rescored(
                inputs, point, client_draws, model_draws, afresh
            )
        return summary(values)

    return statistic


def _rescored(inputs: Inputs, point: ScoreCube, client_draws, model_draws, metrics) -> np.ndarray:
    """(batch, len(metrics), M, 2 + k): ``metrics`` of each resample, scored afresh."""
    groups = inputs.groups
    rows = [groups.rows(c) for c in range(len(groups.sizes))]
    options = inputs.options.replace(metrics=tuple(metrics))
    out = []
    for b in range(client_draws[0].shape[0]):
        picked = np.concatenate([r[d[b]] for r, d in zip(rows, client_draws)])
        resample = replace(
            inputs,
            reference=inputs.reference[torch.from_numpy(picked)],
            partitions={"": ClientGroups(groups.names, groups.index[picked], groups.sizes)},
            models={
                g: y[torch.from_numpy(d[b])]
                for (g, y), d in zip(inputs.models.items(), model_draws)
            },
            options=options,
        )
        cube = ScoreCube.from_table(table_of(resample), metrics, point.models, point.clients)
        out.append(cube.values)
    return np.stack(out)


def _intervals(point: ScoreCube, result, confidence_level: float) -> BootstrapScores:
    """The percentile intervals of a ``scipy.stats.bootstrap`` result; a statistic
    undefined in some resamples gets them over the resamples where it is defined."""
    distribution = np.atleast_2d(result.bootstrap_distribution)
    low = np.array(result.confidence_interval.low, dtype=np.float64, ndmin=1)
    high = np.array(result.confidence_interval.high, dtype=np.float64, ndmin=1)
    n_defined = np.isfinite(distribution).sum(axis=1)
    partly = (n_defined > 0) & (n_defined < distribution.shape[1])
    if partly.any():
        alpha = (1 - confidence_level) / 2
        low[partly], high[partly] = np.nanquantile(distribution[partly], [alpha, 1 - alpha], axis=1)
    return BootstrapScores(point, distribution, low, high, confidence_level, n_defined)


def flat_summary(values: np.ndarray) -> np.ndarray:
    """Every score of the cube as a statistic, in C order of (metric, model, aggregation)."""
    return values.reshape(values.shape[0], -1).T


def model_pairs(n_models: int) -> list[tuple[int, int]]:
    """All pairs (g, h), g < h, in the order of :func:`pairwise_summary`."""
    return list(combinations(range(n_models), 2))


def pairwise_summary(values: np.ndarray) -> np.ndarray:
    """Per metric: score(g) - score(h) for every pair g < h, first of ``all`` then of
    ``avg``, then Kendall tau-b(avg, all) over the models (``ranking.tau_b``: scipy.stats.kendalltau's value, batched).

    Statistics are ordered by metric, then [all pairs, avg pairs, tau]
    (``2 P + 1`` each, P = M (M - 1) / 2, pairs in :func:`model_pairs` order).
    """
    batch, n_metrics, n_models, _ = values.shape
    g, h = np.array(model_pairs(n_models)).T.reshape(2, -1)
    out = []
    for i in range(n_metrics):
        pooled, avg = values[:, i, :, POOLED], values[:, i, :, AVERAGE]
        tau = tau_b(avg, pooled)
        out += [
            (pooled[:, g] - pooled[:, h]).T,
            (avg[:, g] - avg[:, h]).T,
            np.asarray(tau)[None, :],
        ]
    return np.concatenate(out, axis=0)


def score_intervals(result: BootstrapScores) -> pd.DataFrame:
    """The point scores as a tidy table with ``low`` and ``high`` columns, from a
    :func:`bootstrap_scores` run with :func:`flat_summary`."""
    cube, k = result.point, len(result.point.clients)
    values = {
        model: {
            metric: (v[POOLED], v[2:], v[AVERAGE])
            for metric, v in zip(cube.metrics, cube.values[:, g])
        }
        for g, model in enumerate(cube.models)
    }
    table = from_values(values, cube.clients)
    aggregation = {"all": POOLED, "avg": AVERAGE} | {c: 2 + i for i, c in enumerate(cube.clients)}
    flat = [  # each row's statistic in flat_summary's (metric, model, aggregation) order
        (cube.metrics.index(r.metric) * len(cube.models) + cube.models.index(r.model)) * (2 + k)
        + aggregation[r.client or r.aggregation]
        for r in table.itertuples()
    ]
    table = table.assign(low=result.low[flat].astype(float), high=result.high[flat].astype(float))
    return table.sort_values(["model", "metric"], kind="mergesort").reset_index(drop=True)


def with_intervals(
    table: pd.DataFrame,
    reference,
    clients,
    models: Mapping[str, object],
    options: ScoreOptions | Mapping | None = None,
    *,
    n_resamples: int,
    confidence_level: float = 0.95,
    device=None,
    **changes,
) -> pd.DataFrame:
    """``table`` (``metrics.score`` of the same inputs and options) with columns ``low``
    and ``high``: the percentile interval of every score (:func:`bootstrap_scores`
    with :func:`flat_summary`)."""
    result = bootstrap_scores(
        reference,
        clients,
        models,
        options,
        summary=flat_summary,
        n_resamples=n_resamples,
        confidence_level=confidence_level,
        device=device,
        **changes,
    )
    keys = ["model", "metric", "aggregation", "client"]
    bounds = score_intervals(result)[[*keys, "low", "high"]]
    return table.merge(bounds, on=keys, how="left", validate="one_to_one")


def pairwise_intervals(result: BootstrapScores) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Differences of every model pair and Kendall tau(avg, all), with their intervals,
    from a :func:`bootstrap_scores` run with :func:`pairwise_summary`.

    Returns ``pairs`` (metric, aggregation, model_a, model_b, score_a, score_b,
    difference = score_a - score_b, low, high) and ``tau`` (metric, kendall_tau, low,
    high, n_defined: the resamples where tau is defined); ``n_resamples`` and
    ``confidence_level`` on every row.
    """
    cube = result.point
    pairs = model_pairs(len(cube.models))
    point = pairwise_summary(cube.values[None])[:, 0]
    n_resamples = result.distribution.shape[-1]
    pair_rows, tau_rows = [], []
    per_metric = 2 * len(pairs) + 1
    for i, metric in enumerate(cube.metrics):
        base = i * per_metric
        for a, aggregation in enumerate(("all", "avg")):
            scores = cube.values[i, :, (POOLED, AVERAGE)[a]]
            for p, (g, h) in enumerate(pairs):
                j = base + a * len(pairs) + p
                pair_rows.append(
                    (
                        metric,
                        aggregation,
                        cube.models[g],
                        cube.models[h],
                        scores[g],
                        scores[h],
                        point[j],
                        result.low[j],
                        result.high[j],
                    )
                )
        j = base + per_metric - 1
        tau_rows.append((metric, point[j], result.low[j], result.high[j], int(result.n_defined[j])))
    extra = {"n_resamples": n_resamples, "confidence_level": result.confidence_level}
    pair_table = pd.DataFrame(
        pair_rows,
        columns=[
            "metric",
            "aggregation",
            "model_a",
            "model_b",
            "score_a",
            "score_b",
            "difference",
            "low",
            "high",
        ],
    )
    tau_table = pd.DataFrame(
        tau_rows, columns=["metric", "kendall_tau", "low", "high", "n_defined"]
    )
    return pair_table.assign(**extra), tau_table.assign(**extra)
