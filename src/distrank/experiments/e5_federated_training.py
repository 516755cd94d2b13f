r"""E5: scores along federated GAN training; the KD gap is the same at every checkpoint.

The zoo's class-conditional GAN is trained with FedAvg across the clients of a
heterogeneous partition (:func:`distrank.training.fedavg.train_cgan_fedavg`: every
round each client trains generator and discriminator on its own images, the server
averages both with :math:`\lambda_i = n_i/n`, with FedAvgM's server momentum when
``server_momentum`` is set), and centrally with the same number of
steps (:func:`~distrank.training.fedavg.train_cgan_central`), with a checkpoint after
every round. Each checkpoint is a model ``e5-<run>-r<round>``, sampled and scored
against every client and the pool like the zoo's models. By Theorem 1

.. math::
    \mathrm{KD}_\mathrm{avg}(G_r) - \mathrm{KD}_\mathrm{all}(G_r)
        = \sum_i \lambda_i \, \mathrm{KD}(\bar P, P_i)

for every checkpoint :math:`G_r`, of either run, so KD_avg ranks the checkpoints
exactly as KD_all does (Kendall tau 1), while FD's gap moves with the model and its
two aggregations may order checkpoints differently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

import distrank.metrics._table
from distrank.experiments import Job, Outputs, collected
from distrank.figures import metric_label, metric_name, new_figure, paper_style, per_model
from distrank.metrics._ranking import discordant_pairs
from distrank.metrics._registry import display

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "RUNS",
    "round_tags",
    "checkpoint_models",
    "train",
    "e5_table",
    "e5_figure",
    "e5_samples",
    "run",
]

TABLES = ("", "_agreement")
FIGURES = ("", "_samples")

#: The two trainings, FedAvg across the partition's clients and the central baseline.
RUNS = ("fedavg", "central")
_RUN_LABELS = {"fedavg": "FedAvg", "central": "central"}


def round_tags(settings: Mapping) -> list[str]:
    """``r<round>`` of every round, zero-padded: the per-run part of a checkpoint's name."""
    rounds = settings["rounds"]
    return [f"r{r:0{len(str(rounds))}d}" for r in range(1, rounds + 1)]


def checkpoint_models(settings: Mapping) -> dict[str, tuple[str, int]]:
    """Model name of every checkpoint -> (run, round): ``e5-<run>-<round tag>``."""
    return {
        f"e5-{run}-{tag}": (run, r) for run in RUNS for r, tag in enumerate(round_tags(settings), 1)
    }


def train(
    images_path,
    manifest_path,
    out_path,
    *,
    run: str,
    settings: Mapping,
    seed: int,
    checkpoint_dir,
    threads: int,
    device=None,
) -> None:
    """Train run ``run`` (FedAvg or central) on the partition's clients and write the
    bundle of its checkpoints, by model name (:func:`distrank.training.evaluate.save_bundle`)."""
    from distrank.clients import load_manifest
    from distrank.data.images import load_images
    from distrank.training.evaluate import save_bundle
    from distrank.training.fedavg import train_cgan_central, train_cgan_fedavg
    from distrank.training.federated import client_shards

    if run not in RUNS:
        raise ValueError(f"run: expected one of {RUNS}, got {run!r}")
    images, labels = load_images(images_path)
    # single-channel, as the zoo trains (scripts/train_generator.py)
    shards = client_shards(images[..., 0], labels, load_manifest(manifest_path))
    trainer = train_cgan_fedavg if run == "fedavg" else train_cgan_central
    states = trainer(
        shards,
        seed=seed,
        rounds=settings["rounds"],
        local_steps=settings["local_steps"],
        batch_size=settings["batch_size"],
        server_momentum=settings.get("server_momentum", 0.0),
        lr_g=settings.get("lr_g"),
        lr_d=settings.get("lr_d"),
        checkpoint_dir=checkpoint_dir,
        threads=threads,
        device=device,
        desc=f"E5 {run}",
    )
    save_bundle(
        out_path, {f"e5-{run}-{tag}": state for tag, state in zip(round_tags(settings), states)}
    )


def train_centralized(job: Job) -> None:
    """Pre-step ``e5_train_centralized``: :func:`train` one run (wildcard ``run``)."""
    train(
        job.inputs["images"],
        job.inputs["manifest"],
        job.outputs["bundle"],
        run=job.wildcards["run"],
        **job.args("settings", "seed", "checkpoint_dir", "threads", "device"),
    )


STEPS = {"e5_train_centralized": train_centralized}


def check(settings: Mapping, config: Mapping) -> None:
    from distrank.experiments import labelled

    if not labelled(config["reference"]["source"]):
        raise ValueError(
            "config: experiments.E5 trains a class-conditional GAN, which needs "
            "class labels, but reference.source has none"
        )


def scores(settings: Mapping, config: Mapping) -> tuple[str, list[str]]:
    return settings["partition"], list(checkpoint_models(settings))


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    table, agreement = e5_table(collected(inputs, context), checkpoint_models(settings))
    figures = {
        "": e5_figure(table, context["extractor"]),
        "_samples": e5_samples(inputs["samples"], checkpoint_models(settings)),
    }
    return Outputs({"": table, "_agreement": agreement}, figures)


def e5_samples(image_files: Sequence, models: Mapping[str, tuple[str, int]]) -> Figure:
    """One row per checkpoint image file (``model_<name>.npz``; ``models`` is
    :func:`checkpoint_models`), labelled by run and round, one column per class."""
    from distrank.data.images import load_images
    from distrank.figures import samples_grid

    samples = {}
    for path in image_files:
        name = str(path).rsplit("/", 1)[-1].removeprefix("model_").removesuffix(".npz")
        run_, round_ = models[name]
        samples[f"{_RUN_LABELS[run_]}, round {round_}"] = load_images(path)
    classes = sorted({int(c) for _, labels in samples.values() for c in labels})
    return samples_grid(samples, classes)


def e5_table(
    scores: pd.DataFrame,
    checkpoints: Mapping[str, tuple[str, int]],
    metrics: Sequence[str] = ("kd", "fd"),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-checkpoint aggregates and per-metric rank agreement over the checkpoints.

    Parameters
    ----------
    scores : tidy score table with ``all`` and ``avg`` rows of every checkpoint.
    checkpoints : model name -> (run, round), as :func:`checkpoint_models` gives.
    metrics : metric keys, distances (``"kd"``, ``"fd"``).

    Returns
    -------
    per_checkpoint : ``run``, ``round``, ``model``, then per metric ``<M>_all``,
        ``<M>_avg``, ``<M>_gap`` (``avg - all``) and the ranks of
        :func:`distrank.figures.per_model` over all checkpoints; ordered by run
        (:data:`RUNS`) and round.
    agreement : per ``checkpoints`` set (``"all"``: both runs, then each run) and
        metric: ``kendall_tau`` between the avg and all scores, ``p_value``,
        ``n_models`` (checkpoints) and ``rank_flips`` (discordant pairs).
    """
    names = list(checkpoints)
    scores = scores[scores["model"].isin(names)]
    table, agreement = per_model(scores, metrics, difference="gap")
    table.insert(0, "round", [checkpoints[m][1] for m in table["model"]])
    table.insert(0, "run", [checkpoints[m][0] for m in table["model"]])
    order = {run: i for i, run in enumerate(RUNS)}
    table = table.sort_values(
        ["run", "round"], key=lambda c: c.map(order) if c.name == "run" else c, kind="mergesort"
    ).reset_index(drop=True)
    parts = [agreement.assign(checkpoints="all")]
    wide = distrank.metrics._table.wide(scores, metrics)
    for run in RUNS:
        rows = wide["model"].map(lambda m: checkpoints[m][0] == run)  # noqa: B023
        parts.append(
            distrank.metrics._table.rank_agreement(wide[rows], metrics).assign(checkpoints=run)
        )
    agreement = pd.concat(parts, ignore_index=True)
    return table, agreement[["checkpoints", *agreement.columns.drop("checkpoints")]]


def e5_figure(table: pd.DataFrame, extractor: str, *, kd: str = "kd", fd: str = "fd") -> Figure:
    """Two panels, double column, against the round: (a) KD_all and KD_avg of both runs
    (solid FedAvg, dashed central), the constant gap in the title; (b) FD likewise, every
    checkpoint pair that FD_avg and FD_all order differently joined by a red line at
    the FD_avg curve. One legend below both panels.

    ``table`` is the ``per_checkpoint`` output of :func:`e5_table`.
    """
    from matplotlib.lines import Line2D

    colors = {"all": "tab:blue", "avg": "tab:orange"}
    styles = {"fedavg": "-", "central": "--"}
    with paper_style():
        fig, axes = new_figure(1, 2, width="double", height=3.0)
        for ax, metric in ((axes[0, 0], kd), (axes[0, 1], fd)):
            name = display(metric)
            for run in RUNS:
                part = table[table["run"] == run]
                for agg in ("all", "avg"):
                    ax.plot(
                        part["round"],
                        part[f"{name}_{agg}"],
                        styles[run],
                        marker="o",
                        ms=2.5,
                        color=colors[agg],
                    )
            ax.set_xlabel("round (central: the same number of steps)")
            ax.set_ylabel(metric_label(metric, extractor))
        gap = table[f"{display(kd)}_gap"].to_numpy(float)
        axes[0, 0].set_title(
            f"(a) {metric_name(kd, extractor)}: avg $-$ all = {gap.mean():.4g} "
            f"at every checkpoint\n(max $-$ min of the gap {np.ptp(gap):.1g})",
            loc="left",
        )
        flips = _mark_flips(axes[0, 1], table, display(fd))
        axes[0, 1].set_title(
            f"(b) {metric_name(fd, extractor)}: {flips} checkpoint pair"
            f"{'' if flips == 1 else 's'} ordered differently\nby avg and all "
            "(red lines)",
            loc="left",
        )
        name = {m: metric_name(m, extractor) for m in (kd, fd)}
        handles = [
            Line2D(
                [],
                [],
                color=colors[a],
                marker="o",
                ms=2.5,
                label=rf"{name[kd]}/{name[fd]}$_\mathrm{{{a}}}$",
            )
            for a in colors
        ]
        handles += [Line2D([], [], color="0.3", ls=styles[r], label=_RUN_LABELS[r]) for r in RUNS]
        handles.append(Line2D([], [], color="tab:red", lw=0.6, label="pair ordered differently"))
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles))
    return fig


def _mark_flips(ax, table: pd.DataFrame, name: str) -> int:
    """Join, at the avg curve, every checkpoint pair that avg and all order differently;
    returns their number."""
    x = table["round"].to_numpy(float)
    avg = table[f"{name}_avg"].to_numpy(float)
    pairs = discordant_pairs(table[f"{name}_all"].to_numpy(float), avg)
    for i, j in pairs:
        ax.plot([x[i], x[j]], [avg[i], avg[j]], color="tab:red", lw=0.6, alpha=0.6, zorder=1)
    return len(pairs)
