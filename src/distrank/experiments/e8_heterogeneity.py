r"""E8: how the heterogeneity of the clients moves the rank agreement of avg and all.

The same reference pool is split into ``n_clients`` clients by Dirichlet(:math:`\alpha`)
label skew for each :math:`\alpha` in ``alphas`` (large: near iid; small: each client a
few classes), plus the limit of one class per client, each drawn with several seeds.
The pool is the study's reference, or a seeded subset of ``pool_per_class`` rows of
each class (FD's cost grows with the cube of the client size). For every partition
and metric, Kendall's :math:`\tau_b` compares the models' ``avg``
and ``all`` scores (the whole zoo), and the partition's heterogeneity is measured by
the KD gap (Theorem 1, :math:`\lambda_i = n_i/n`)

.. math::
    H = \mathrm{KD}_\mathrm{avg} - \mathrm{KD}_\mathrm{all}
      = \sum_i \lambda_i \mathrm{KD}(\bar P, P_i),

one number per partition (the same for every model). Theorem 1 predicts
:math:`\tau = 1` for KD at every partition, and Recall's identity
:math:`\mathrm{Recall}_\mathrm{all} = \sum_i \lambda_i \mathrm{Recall}_i` gives
:math:`\tau = 1` for Recall; the other metrics need not agree.

E8 is a simulation over partitions: one job scores every partition in both
aggregations with the same engine, :func:`distrank.metrics.score_partitions`,
which forms the partition-free sums once. Partitions are drawn over blocks of
``block_rows`` rows of one class (the Dirichlet scheme of :mod:`distrank.clients`, in
units of blocks), so that the blocks are a common refinement of every partition and
the KD kernel sums are formed once, between blocks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

import distrank.metrics._table
from distrank.clients import partition
from distrank.experiments import Outputs, named_on
from distrank.figures import metric_label, metric_name, new_figure, paper_style
from distrank.metrics._metric import METRIC_KEYS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "ONE_CLASS",
    "block_index",
    "draw_partitions",
    "partition_agreement",
    "e8_table",
    "e8_heatmap",
    "e8_index_figure",
    "run",
]

TABLES = ("", "_partitions")
FIGURES = ("", "_index")

#: Name of the one-class-per-client setting (the limit of alpha -> 0).
ONE_CLASS = "one class"
#: Significant digits at which E8 ranks scores (see :func:`partition_agreement`).
SIGNIFICANT_DIGITS = 12


def check(settings: Mapping, config: Mapping) -> None:
    """E8 splits the reference by its class labels, into clients that PRDC can score."""
    source = config["reference"]["source"]
    if source["kind"] == "folder" and not source.get("labels_from_subfolders", False):
        raise ValueError(
            "config: experiments.E8 partitions the reference by class, but "
            "reference.source is a folder without labels_from_subfolders"
        )
    need = max(config["metrics"]["pr_k"], config["metrics"]["dc_k"]) + 1
    if settings["min_rows"] < need:
        raise ValueError(
            f"config: experiments.E8.min_rows is {settings['min_rows']}, but "
            f"PRDC's k-NN radii (metrics.pr_k, dc_k) need {need} rows a client"
        )


def setting_name(alpha: float) -> str:
    return f"alpha={alpha:g}"


def block_index(labels, *, block_rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of each class in a seeded random order, cut into blocks of about
    ``block_rows`` rows (``ceil(n_c / block_rows)`` blocks whose sizes differ by at most
    one). Returns the block of each row (n,) and the class of each block (B,)."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels: expected (n,) ints, got {labels.dtype} {labels.shape}")
    if (
        isinstance(block_rows, bool)
        or not isinstance(block_rows, (int, np.integer))
        or block_rows < 1
    ):
        raise ValueError(f"block_rows: expected an int >= 1, got {block_rows!r}")
    rng = np.random.default_rng(seed)
    block = np.empty(len(labels), dtype=np.int64)
    block_labels = []
    for c in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == c))
        for part in np.array_split(rows, math.ceil(len(rows) / block_rows)):
            block[part] = len(block_labels)
            block_labels.append(c)
    return block, np.asarray(block_labels, dtype=np.int64)


def draw_partitions(
    labels,
    *,
    n_clients: int,
    alphas: Sequence[float],
    one_class: bool,
    seeds: int,
    block_rows: int,
    min_rows: int,
    seed: int,
) -> tuple[dict[str, np.ndarray], pd.DataFrame]:
    """Every partition of E8: Dirichlet(alpha) label skew over blocks of one class
    (:func:`block_index`), for each alpha and seeds ``seed .. seed + seeds - 1``, and
    one class per client (as many clients as classes; the same for every seed).

    A draw leaving a client fewer than ``min_rows`` rows is redrawn (the scheme's
    ``min_rows``, in blocks). Returns ``{name: (n,) client of each row}`` and a table
    ``partition, setting, alpha (inf for one class), seed`` in setting order.
    """
    block, block_labels = block_index(labels, block_rows=block_rows, seed=seed)
    smallest = int(np.bincount(block).min())
    min_blocks = math.ceil(min_rows / smallest)
    parts, meta = {}, []
    for alpha in alphas:
        scheme = {
            "kind": "dirichlet",
            "n_clients": n_clients,
            "alpha": alpha,
            "min_rows": min_blocks,
        }
        for s in range(seed, seed + seeds):
            name = f"{setting_name(alpha)}/seed{s}"
            parts[name] = partition(block_labels, scheme=scheme, seed=s)[block]
            meta.append((name, setting_name(alpha), float(alpha), s))
    if one_class:
        clients = partition(block_labels, scheme={"kind": "one_class"}, seed=seed)[block]
        for s in range(seed, seed + seeds):
            name = f"{ONE_CLASS}/seed{s}"
            parts[name] = clients
            meta.append((name, ONE_CLASS, math.inf, s))
    return parts, pd.DataFrame(meta, columns=["partition", "setting", "alpha", "seed"])


def partition_agreement(
    scores: pd.DataFrame, meta: pd.DataFrame, metrics: Sequence[str] = METRIC_KEYS
) -> pd.DataFrame:
    """Per partition and metric: Kendall tau(avg, all) over the models and the
    heterogeneity index (KD gap, mean over models; its max - min over models).

    ``scores`` is the table of :func:`~distrank.metrics.score_partitions`
    (a ``partition`` column before the tidy score columns), ``meta`` that of
    :func:`draw_partitions`. Columns: ``partition, setting, alpha, seed, metric,
    kendall_tau, rank_flips, n_models, heterogeneity, heterogeneity_spread``.

    Scores are ranked at ``SIGNIFICANT_DIGITS`` significant digits: two models with
    the same Recall_all have the same Recall_avg too, exactly in arithmetic, but the
    weighted sum of client values rounds differently per model, and without this a
    floating-point difference of 1e-16 would count as an order (tau_b < 1).
    """
    if "kd" not in metrics:
        raise ValueError("metrics: the heterogeneity index is the KD gap, so 'kd' is needed")
    rows = []
    for _, part in meta.iterrows():
        wide = distrank.metrics._table.wide(
            scores[scores["partition"] == part["partition"]], metrics
        )
        gap = wide["KD_avg"] - wide["KD_all"]
        values = wide.columns.drop("model")
        rounded = wide.assign(
            **{c: [float(f"{v:.{SIGNIFICANT_DIGITS}g}") for v in wide[c]] for c in values}
        )
        agreement = distrank.metrics._table.rank_agreement(rounded, metrics)
        agreement = agreement.assign(
            partition=part["partition"],
            setting=part["setting"],
            alpha=part["alpha"],
            seed=part["seed"],
            heterogeneity=float(gap.mean()),
            heterogeneity_spread=float(gap.max() - gap.min()),
        )
        rows.append(agreement)
    columns = [
        "partition",
        "setting",
        "alpha",
        "seed",
        "metric",
        "kendall_tau",
        "rank_flips",
        "n_models",
        "heterogeneity",
        "heterogeneity_spread",
    ]
    return pd.concat(rows, ignore_index=True)[columns]


def e8_table(per_partition: pd.DataFrame) -> pd.DataFrame:
    """Per setting (in the order of ``per_partition``) and metric: ``tau_mean``,
    ``tau_min``, ``tau_max`` over the seeds, ``heterogeneity_mean`` (mean index over the
    seeds), ``n_seeds``."""
    order = list(dict.fromkeys(per_partition["setting"]))
    metrics = list(dict.fromkeys(per_partition["metric"]))
    grouped = per_partition.groupby(["setting", "metric"], sort=False)
    table = grouped.agg(
        alpha=("alpha", "first"),
        tau_mean=("kendall_tau", "mean"),
        tau_min=("kendall_tau", "min"),
        tau_max=("kendall_tau", "max"),
        heterogeneity_mean=("heterogeneity", "mean"),
        n_seeds=("seed", "nunique"),
    ).reset_index()
    table["setting"] = pd.Categorical(table["setting"], order, ordered=True)
    table["metric"] = pd.Categorical(table["metric"], metrics, ordered=True)
    table = table.sort_values(["setting", "metric"]).reset_index(drop=True)
    table["setting"] = table["setting"].astype(str)
    table["metric"] = table["metric"].astype(str)
    return table


def _setting_label(setting: str) -> str:
    return setting.replace("alpha=", r"$\alpha$=")


def e8_heatmap(table: pd.DataFrame) -> Figure:
    """Metric (rows) x setting (columns, from near-iid to one class per client); the
    colour is the mean Kendall tau over seeds, each cell annotated with it."""
    settings = list(dict.fromkeys(table["setting"]))
    metrics = list(dict.fromkeys(table["metric"]))
    grid = table.pivot(index="metric", columns="setting", values="tau_mean")
    grid = grid.loc[metrics, settings].to_numpy(float)
    with paper_style():
        fig, axes = new_figure(1, 1, width="single", height=2.5)
        ax = axes[0, 0]
        image = ax.imshow(grid, cmap="RdBu", vmin=-1.0, vmax=1.0, aspect="auto")
        for (i, j), tau in np.ndenumerate(grid):
            ax.text(
                j,
                i,
                f"{tau:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if abs(tau) > 0.6 else "black",
            )
        ax.set_xticks(
            range(len(settings)),
            [_setting_label(s) for s in settings],
            rotation=35,
            ha="right",
            rotation_mode="anchor",
        )
        ax.set_yticks(range(len(metrics)), metrics)
        ax.set_xlabel("client partition (Dirichlet label skew)")
        ax.tick_params(length=0)
        for spine in ax.spines.values():
            spine.set_visible(False)
        fig.colorbar(
            image, ax=ax, label=r"Kendall $\tau$ (avg vs all), mean over seeds", shrink=0.9
        )
    return fig


def e8_index_figure(
    per_partition: pd.DataFrame, table: pd.DataFrame, extractor: str, kernel_metric: str = "kd"
) -> Figure:
    """Mean Kendall tau against the mean heterogeneity index, one line per metric (a
    point per setting), the band spanning the seeds' min to max tau; the points of the
    seeds themselves are drawn faintly."""
    metrics = list(dict.fromkeys(table["metric"]))
    styles = dict(zip(metrics, _STYLES))
    with paper_style():
        fig, axes = new_figure(1, 1, width="single", height=3.0)
        ax = axes[0, 0]
        for metric in metrics:
            style = styles[metric]
            rows = table[table["metric"] == metric].sort_values("heterogeneity_mean")
            x = rows["heterogeneity_mean"].to_numpy(float)
            ax.fill_between(
                x, rows["tau_min"], rows["tau_max"], color=style["color"], alpha=0.15, lw=0
            )
            ax.plot(x, rows["tau_mean"], ms=3.5, label=metric, **style)
            seeds = per_partition[per_partition["metric"] == metric]
            ax.scatter(
                seeds["heterogeneity"],
                seeds["kendall_tau"],
                s=4,
                color=style["color"],
                alpha=0.35,
                lw=0,
            )
        name = metric_name(kernel_metric, extractor)
        where = metric_label(kernel_metric, extractor).removeprefix(name)
        ax.set_xlabel(
            rf"heterogeneity index {name}$_\mathrm{{avg}}$ - "
            rf"{name}$_\mathrm{{all}}${where}"
        )
        ax.set_ylabel(r"Kendall $\tau$ (avg vs all)")
        ax.set_ylim(min(-0.05, float(table["tau_min"].min()) - 0.05), 1.05)
        fig.legend(loc="outside upper center", ncols=3, columnspacing=1.0, handlelength=2.2)
    return fig


#: Line styles of the metrics in :func:`e8_index_figure`: metrics that agree exactly
#: (KD, Recall) overlap at tau = 1, so dashes and markers keep each visible.
_STYLES = [
    dict(color="tab:blue", ls="-", lw=2.4, marker="o"),
    dict(color="tab:orange", ls="-", marker="s"),
    dict(color="tab:green", ls="-", marker="^"),
    dict(color="tab:red", ls=(0, (3, 2)), marker="x"),
    dict(color="tab:purple", ls="-", marker="v"),
    dict(color="tab:brown", ls="-", marker="D"),
]


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    from distrank.features.cache import load_features, load_labelled
    from distrank.metrics._options import score_options
    from distrank.metrics._reaggregate import score_partitions

    reference, labels = load_labelled(inputs["reference"])
    if labels is None:
        raise ValueError(f"{inputs['reference']}: E8 needs the reference's class labels")
    if settings.get("pool_per_class") is not None:  # a seeded pool, per_class rows a class
        from distrank.data.subsets import per_class_subset

        rows = per_class_subset(labels, settings["pool_per_class"], seed=context["seed"])
        reference, labels = reference[rows], labels[rows]
    models = {
        Path(p).name.removeprefix("model_").removesuffix(".npz"): load_features(p)
        for p in inputs["models"]
    }
    parts, meta = draw_partitions(
        labels,
        n_clients=settings["n_clients"],
        alphas=settings["alphas"],
        one_class=settings["one_class"],
        seeds=settings["seeds"],
        block_rows=settings["block_rows"],
        min_rows=settings["min_rows"],
        seed=context["seed"],
    )
    # Identical partitions (one class per client, for every seed) are scored once.
    unique = {}
    for name, clients in parts.items():
        unique.setdefault(clients.tobytes(), name)
    scores = score_partitions(
        reference,
        {name: parts[name] for name in unique.values()},
        models,
        score_options(context["metrics"], seed=context["seed"]),
    )
    alias = {name: unique[clients.tobytes()] for name, clients in parts.items()}
    scores = pd.concat(
        [
            scores[scores["partition"] == source].assign(partition=name)
            for name, source in alias.items()
        ],
        ignore_index=True,
    )
    # metrics named as on the study's network (FID/KID on Inception-v3), figures included
    per_partition = named_on(partition_agreement(scores, meta), context["extractor"])
    table = e8_table(per_partition)
    return Outputs(
        {"": table, "_partitions": per_partition},
        {
            "": e8_heatmap(table),
            "_index": e8_index_figure(per_partition, table, context["extractor"]),
        },
    )
