r"""E10: how sure is each ranking decision? Bootstrap intervals on E1's zoo and partition.

For every metric, the models are ranked by their client average (D_avg), and each
adjacent pair (ranks r and r + 1) gets the bootstrap interval of the better model's
margin, :math:`D_\mathrm{avg}(\text{worse}) - D_\mathrm{avg}(\text{better})` for a
distance (the sign flipped for Precision, Recall, Density, Coverage), so a margin
is positive at the point estimate; the pair is *separated* at the confidence level
when its whole interval is above 0. Kendall tau-b(avg, all) gets its interval too:
KD's is exactly [1, 1], since Theorem 1 holds in every resample.

Resampling (``distrank.metrics._bootstrap``): each client's reference rows within
the client and each model's generated rows, independently; percentile intervals.
KD's resamples are re-weightings of its kernel blocks (``n_resamples.kd``, e.g.
1000); FD and PRDC rescore every resample (``n_resamples.fd``, ``.prdc``: as many
as the budget allows, stated in every row), copies of rows included, so their
intervals can be offset from the point estimates (see ``distrank.metrics._bootstrap``).
The centralized pre-step (:func:`write_bootstrap_tables`) reads the pooled reference
and writes every pair's interval; :func:`e10_table` and :func:`e10_figure` select and
draw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from distrank._io import atomic_open
from distrank.experiments import Job, Outputs
from distrank.figures import metric_name, new_figure, paper_style
from distrank.metrics._metric import PRDC
from distrank.metrics._options import score_options
from distrank.metrics._registry import HIGHER_IS_BETTER, METRICS, display

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "TABLES",
    "check",
    "run",
    "bootstrap_tables",
    "write_bootstrap_tables",
    "e10_table",
    "e10_figure",
]

TABLES = ("", "_tau")
COLUMNS = [
    "metric",
    "rank",
    "better",
    "worse",
    "score_better",
    "score_worse",
    "margin",
    "low",
    "high",
    "separated",
    "n_resamples",
    "confidence_level",
]


def check(settings: Mapping, config: Mapping) -> None:
    """Each metric's family says whether the bootstrap can resample it under the config's
    scoring options (``Family.check_resample``)."""
    options = score_options(config["metrics"])
    for key in settings["metrics"]:
        try:
            METRICS[key].family.check_resample(options)
        except ValueError as err:
            raise ValueError(
                f"config: experiments.E10 bootstraps {display(key)}: metrics.{err}"
            ) from None


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    pairs, tau = pd.read_csv(inputs["pairs"]), pd.read_csv(inputs["tau"])
    table = e10_table(pairs)
    tau = tau.assign(metric=tau.metric.map(display))
    return Outputs({"": table, "_tau": tau}, {"": e10_figure(table, tau, context["extractor"])})


def bootstrap_tables(
    reference,
    clients,
    models: Mapping[str, np.ndarray],
    options=None,
    *,
    n_resamples: Mapping[str, int],
    confidence_level: float,
    device=None,
    **changes,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Intervals of every model pair's difference (``all`` and ``avg``) and of tau.

    ``options`` (:class:`~distrank.metrics.ScoreOptions` or a mapping of them,
    with ``changes``) say what is scored; ``seed`` also seeds the resampling. KD, FD
    and the PRDC metrics are bootstrapped separately with ``n_resamples["kd"]``,
    ``["fd"]``, ``["prdc"]`` resamples (each from ``numpy.random.default_rng(seed)``);
    the tables are those of ``pairwise_intervals``,
    concatenated.
    """
    from distrank.metrics._bootstrap import bootstrap_scores, pairwise_intervals, pairwise_summary
    from distrank.metrics._options import score_options

    opts = score_options(options, **changes)
    metrics = opts.metrics
    groups = [[m] for m in metrics if m in ("kd", "fd")] + [[m for m in metrics if m in PRDC]]
    pairs, taus = [], []
    for group in (g for g in groups if g):
        key = "prdc" if group[0] in PRDC else group[0]
        result = bootstrap_scores(
            reference,
            clients,
            models,
            opts.replace(metrics=tuple(group)),
            summary=pairwise_summary,
            n_resamples=n_resamples[key],
            confidence_level=confidence_level,
            device=device,
        )
        p, t = pairwise_intervals(result)
        pairs.append(p)
        taus.append(t)
    return pd.concat(pairs, ignore_index=True), pd.concat(taus, ignore_index=True)


def write_bootstrap_tables(
    reference_path,
    manifest_path,
    model_paths: Mapping,
    pairs_path,
    tau_path,
    *,
    metrics: Sequence[str],
    n_resamples: Mapping[str, int],
    confidence_level: float,
    seed: int,
    metrics_config: Mapping,
    device=None,
    threads: int = 1,
) -> None:
    """The centralized pre-step: :func:`bootstrap_tables` of the files, to two CSVs.

    ``metrics_config`` is the config's ``metrics`` section (the scoring options;
    ``metrics`` and ``seed`` replace its own); torch uses at most ``threads`` threads.
    """
    from distrank.clients import UNASSIGNED, load_manifest
    from distrank.features.cache import load_features
    from distrank.metrics._options import score_options
    from distrank.zoo import torch_session

    options = score_options(metrics_config, metrics=tuple(metrics), seed=seed)
    owner = load_manifest(manifest_path)
    pooled = owner != UNASSIGNED
    models = {name: load_features(path) for name, path in model_paths.items()}
    with torch_session(seed, threads):
        pairs, tau = bootstrap_tables(
            load_features(reference_path)[pooled],
            owner[pooled],
            models,
            options,
            n_resamples=n_resamples,
            confidence_level=confidence_level,
            device=device,
        )
    for table, path in ((pairs, pairs_path), (tau, tau_path)):
        with atomic_open(path, "w") as f:
            table.to_csv(f, index=False)


def bootstrap_centralized(job: Job) -> None:
    """Pre-step ``e10_bootstrap_centralized``: :func:`write_bootstrap_tables` on the
    rule's files."""
    settings = job.params["settings"]
    write_bootstrap_tables(
        job.inputs["reference"],
        job.inputs["manifest"],
        dict(zip(job.params["models"], job.inputs["models"])),
        job.outputs["pairs"],
        job.outputs["tau"],
        metrics=settings["metrics"],
        n_resamples=settings["n_resamples"],
        confidence_level=settings["confidence_level"],
        metrics_config=job.params["metrics"],
        **job.args("seed", "device", "threads"),
    )


STEPS = {"e10_bootstrap_centralized": bootstrap_centralized}


def e10_table(pairs: pd.DataFrame) -> pd.DataFrame:
    """Adjacent pairs of each metric's D_avg ranking with the interval of the margin.

    ``pairs`` is a :func:`bootstrap_tables` pair table. Per metric (in its order),
    models are ranked by their ``avg`` score (best first; ties by name); row r holds
    ranks r and r + 1: ``margin`` = how much better ``better`` is in the metric's
    direction, ``low``/``high`` its percentile interval, ``separated`` = low > 0.
    """
    rows = []
    for metric in dict.fromkeys(pairs.metric):
        mine = pairs[(pairs.metric == metric) & (pairs.aggregation == "avg")]
        direction = 1.0 if HIGHER_IS_BETTER[metric] else -1.0
        score = dict(zip(mine.model_a, mine.score_a)) | dict(zip(mine.model_b, mine.score_b))
        ranked = sorted(score, key=lambda g: (-direction * score[g], g))
        by_pair = {(r.model_a, r.model_b): r for r in mine.itertuples()}
        for rank, (better, worse) in enumerate(zip(ranked, ranked[1:]), start=1):
            row = by_pair.get((better, worse))
            sign = direction
            if row is None:
                row, sign = by_pair[(worse, better)], -direction
            low, high = sorted((sign * row.low, sign * row.high))
            rows.append(
                (
                    display(metric),
                    rank,
                    better,
                    worse,
                    score[better],
                    score[worse],
                    sign * row.difference + 0.0,
                    low + 0.0,
                    high + 0.0,
                    bool(low > 0),
                    int(row.n_resamples),
                    float(row.confidence_level),
                )
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def _symlog_axis(ax, rows: pd.DataFrame) -> None:
    """Symmetric-log x axis, linear within the power of ten at or below the 10th
    percentile of the panel's nonzero |margin|, |low|, |high|; limits padded so no
    point sits on the frame; ticks every decade, or every other beyond five in all."""
    from matplotlib.ticker import SymmetricalLogLocator

    values = rows[["margin", "low", "high"]].to_numpy(float)
    nonzero = np.abs(values[values != 0])
    linthresh = float(10 ** np.floor(np.log10(np.percentile(nonzero, 10)))) if len(nonzero) else 1.0
    ax.set_xscale("symlog", linthresh=linthresh)
    lo, hi = min(float(values.min()), 0.0), max(float(values.max()), linthresh)
    ax.set_xlim(-linthresh if lo >= 0 else 1.6 * lo, 1.6 * hi)
    decades = sum(np.log10(max(v, linthresh) / linthresh) for v in (hi, -lo))
    ax.xaxis.set_major_locator(
        SymmetricalLogLocator(base=100 if decades > 5 else 10, linthresh=linthresh)
    )


def e10_figure(table: pd.DataFrame, tau: pd.DataFrame, extractor: str) -> Figure:
    """Forest plot, one panel per metric: every adjacent pair of the D_avg ranking (best
    pair on top), its margin and percentile interval; filled = separated (interval above
    0). Titles give the count separated and tau(avg, all) with its interval. Margins
    span orders of magnitude, so the x axes are symmetric-log, linear near 0
    (:func:`_linear_range`)."""
    metrics = list(dict.fromkeys(table.metric))
    keys = {display(k): k for k in HIGHER_IS_BETTER}
    ncols = 2
    nrows = -(-len(metrics) // ncols)
    n_pairs = int(table.groupby("metric").size().max())
    with paper_style():
        fig, axes = new_figure(nrows, ncols, width="double", height=nrows * (0.45 + 0.17 * n_pairs))
        taus = tau.set_index("metric")
        for letter, ax, metric in zip("abcdefghij", axes.flat, metrics):
            rows = table[table.metric == metric].sort_values("rank")
            y = -rows["rank"].to_numpy()
            sep = rows.separated.to_numpy(bool)
            ax.hlines(y, rows.low, rows.high, color="0.35", lw=0.9, zorder=2)
            ax.scatter(
                rows.margin[sep], y[sep], s=14, color="tab:blue", zorder=3, label="separated"
            )
            ax.scatter(
                rows.margin[~sep],
                y[~sep],
                s=14,
                facecolor="white",
                edgecolor="tab:red",
                zorder=3,
                label="not separated",
            )
            ax.axvline(0.0, color="0.5", lw=0.7, ls="--", zorder=1)
            _symlog_axis(ax, rows)
            ax.set_yticks(y, [f"{b} > {w}" for b, w in zip(rows.better, rows.worse)], fontsize=6.5)
            ax.set_ylim(y.min() - 0.7, y.max() + 0.7)
            key = keys.get(metric, metric)
            name = metric_name(key, extractor)
            ax.set_xlabel(f"margin of the better model in {name}$_\\mathrm{{avg}}$")
            t = taus.loc[metric]
            first = rows.iloc[0]
            ax.set_title(
                f"({letter}) {name}: {sep.sum()}/{len(sep)} separated, "
                f"$\\tau$ = {t.kendall_tau:.2f} [{t.low:.2f}, {t.high:.2f}], "
                f"B = {int(first.n_resamples)}",
                loc="left",
                fontsize=7.5,
            )
        for ax in axes.flat[len(metrics) :]:
            ax.set_visible(False)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        level = int(round(100 * table.confidence_level.iloc[0]))
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncols=2,
            title=f"{level} % percentile bootstrap interval",
        )
    return fig
