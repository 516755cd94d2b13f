r"""E7: fine-tuning a generator with an MMD loss across clients: FedSGD is central training.

The zoo's trained cGAN is fine-tuned on the squared MMD (the package's own KD, one
fixed kernel and bandwidth) between generated batches and the reference data, in the
feature space of EfficientNet-Lite0 (:func:`distrank.training.mmd.finetune_mmd`), four
ways with the same generator steps and latent batches: FedSGD (every step the clients'
gradients on the shared batch, averaged with :math:`\lambda_i = n_i/n`), FedAvg (local
steps, weights averaged), centralized (the pooled data), and none. Since
:math:`\sum_i \lambda_i \mathrm{KD}(X_i, Y) = \mathrm{KD}(X, Y) + \text{const}`
(Theorem 1), FedSGD's averaged gradient is the central one and its curve is the central
curve, step for step; FedAvg's local steps follow each client's own objective and need
not. Each evaluation point is a model ``e7-<method>-s<step>`` (``e7-none``: the start,
step 0 of every run), sampled and scored like the zoo's models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

import distrank.metrics._table
from distrank.experiments import Job, Outputs, collected
from distrank.figures import metric_label, new_figure, paper_style
from distrank.metrics._metric import BANDWIDTH_KERNELS
from distrank.metrics._registry import display

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "TRAINED",
    "NONE",
    "step_tags",
    "evaluation_models",
    "reuses_features",
    "finetune",
    "e7_table",
    "e7_figure",
    "run",
]

#: The fine-tuning runs, and the model of the untouched start.
TRAINED = ("fedsgd", "fedavg", "central")
NONE = "e7-none"
_LABELS = {
    "fedsgd": "FedSGD",
    "fedavg": "FedAvg",
    "central": "centralized",
    "none": "no fine-tuning",
}


def step_tags(settings: Mapping) -> list[str]:
    """``s<step>`` of every evaluation point after the start, zero-padded: the per-run
    part of a fine-tuned model's name."""
    steps, every = settings["steps"], settings["eval_every"]
    return [f"s{t:0{len(str(steps))}d}" for t in range(every, steps + 1, every)]


def evaluation_models(settings: Mapping) -> dict[str, tuple[str, int]]:
    """Model name of every evaluation point -> (method, step): ``e7-none`` (step 0),
    then ``e7-<method>-<step tag>`` every ``eval_every`` steps of each trained method."""
    models = {NONE: ("none", 0)}
    for method in TRAINED:
        models |= {f"e7-{method}-{tag}": (method, int(tag[1:])) for tag in step_tags(settings)}
    return models


def reuses_features(config: Mapping) -> bool:
    """Whether the loss's embedding is the study's feature network (EfficientNet-Lite0 at
    its default resolution), so training reads the feature step's reference features;
    otherwise the job embeds the reference images itself."""
    return config["features"]["extractor"] == "efficientnet_lite0"


def finetune(
    state_path,
    manifest_path,
    out_path,
    *,
    method: str,
    settings: Mapping,
    seed: int,
    checkpoint_dir,
    threads: int,
    reference_features=None,
    reference_images=None,
    device=None,
) -> None:
    """Fine-tune the zoo's cGAN by ``method`` and write the bundle of its evaluation
    points after the start, by model name (:func:`distrank.training.evaluate.save_bundle`).

    The reference is either ``reference_features``, the feature step's (EfficientNet-Lite0,
    checked by their metadata; see :func:`reuses_features`), or ``reference_images``,
    embedded here. The kernel's
    bandwidth, where it has one and ``settings["bandwidth"]`` is null, is the median
    heuristic on the pooled embedded reference, computed once before training.
    """
    import torch

    from distrank.clients import UNASSIGNED, load_manifest
    from distrank.data.images import load_images
    from distrank.features.cache import load_features, read_meta
    from distrank.metrics._kernels import make_kernel, median_bandwidth
    from distrank.training.evaluate import save_bundle
    from distrank.training.mmd import Lite0Embedding, embed_reference, finetune_mmd
    from distrank.zoo import load_state

    if method not in TRAINED:
        raise ValueError(f"method: expected one of {TRAINED}, got {method!r}")
    if (reference_features is None) == (reference_images is None):
        raise ValueError("give one of reference_features and reference_images")
    embedding = Lite0Embedding()
    if reference_features is not None:
        reference, meta = load_features(reference_features), read_meta(reference_features)
        wanted = embedding.preprocessing.to_dict()
        if meta.get("extractor") != "efficientnet_lite0" or meta.get("preprocessing") != wanted:
            raise ValueError(
                f"{reference_features}: features of {meta.get('extractor')} with "
                "another preprocessing than the loss's EfficientNet-Lite0"
            )
        reference = torch.from_numpy(reference)
    else:
        images, _ = load_images(reference_images)
        reference = embed_reference(embedding, images[..., 0], device=device).cpu()  # as the zoo
    owner = load_manifest(manifest_path)
    rows = owner != UNASSIGNED
    reference, clients = reference[torch.from_numpy(rows)], owner[rows]
    params = {}
    if settings["kernel"] in BANDWIDTH_KERNELS:
        params["bandwidth"] = settings["bandwidth"] or median_bandwidth(
            reference, kernel=settings["kernel"], seed=seed
        )
    kernel = make_kernel(settings["kernel"], params, reference.shape[1])
    points = finetune_mmd(
        load_state(state_path),
        reference,
        clients,
        method=method,
        kernel=kernel,
        embedding=embedding,
        seed=seed,
        **{k: settings[k] for k in ("steps", "batch_size", "lr", "eval_every", "local_steps")},
        checkpoint_dir=checkpoint_dir,
        threads=threads,
        device=device,
    )
    save_bundle(
        out_path,
        {f"e7-{method}-{tag}": state for tag, (_, state) in zip(step_tags(settings), points[1:])},
    )


def finetune_centralized(job: Job) -> None:
    """Pre-step ``e7_finetune_centralized``: :func:`finetune` by one method (wildcard
    ``method``)."""
    finetune(
        job.inputs["state"],
        job.inputs["manifest"],
        job.outputs["bundle"],
        method=job.wildcards["method"],
        reference_features=job.inputs.get("reference_features"),
        reference_images=job.inputs.get("reference_images"),
        **job.args("settings", "seed", "checkpoint_dir", "threads", "device"),
    )


STEPS = {"e7_finetune_centralized": finetune_centralized}


def check(settings: Mapping, config: Mapping) -> None:
    if settings.get("bandwidth") is not None and settings["kernel"] not in BANDWIDTH_KERNELS:
        raise ValueError(
            f"config: experiments.E7.bandwidth is set, but kernel {settings['kernel']!r} has none"
        )
    if "cgan" not in config.get("zoo", {}):
        raise ValueError(
            "config: experiments.E7 fine-tunes the zoo's cGAN, but zoo.cgan is not set"
        )
    if settings["steps"] % settings["eval_every"]:
        raise ValueError(
            f"config: experiments.E7.steps ({settings['steps']}) must be a "
            f"multiple of eval_every ({settings['eval_every']})"
        )
    if settings["eval_every"] % settings["local_steps"]:
        raise ValueError(
            f"config: experiments.E7.eval_every ({settings['eval_every']}) must be "
            f"a multiple of local_steps ({settings['local_steps']}): FedAvg is "
            "evaluated after whole rounds"
        )


def scores(settings: Mapping, config: Mapping) -> tuple[str, list[str]]:
    return settings["partition"], list(evaluation_models(settings))


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    table = e7_table(
        collected(inputs, context), evaluation_models(settings), steps=settings["steps"]
    )
    return Outputs({"": table}, {"": e7_figure(table, context["extractor"])})


def e7_table(
    scores: pd.DataFrame,
    models: Mapping[str, tuple[str, int]],
    *,
    steps: int,
    metrics: Sequence[str] = ("kd", "fd"),
) -> pd.DataFrame:
    """KD_all, KD_avg, FD_all and FD_avg per run and evaluation point.

    ``models`` maps model names to (method, step) (:func:`evaluation_models`). Every
    trained run starts at step 0 from the ``none`` model, and ``none`` is listed at
    every evaluation step (the untouched generator), so all four runs share the steps.
    Rows are ordered by method (FedSGD, FedAvg, centralized, none) and step.
    """
    wide = distrank.metrics._table.wide(
        scores[scores["model"].isin(list(models))], metrics
    ).set_index("model")
    start = [m for m, (method, _) in models.items() if method == "none"]
    if len(start) != 1:
        raise ValueError(f"models: expected one 'none' model (step 0), got {start}")
    points = sorted({t for _, t in models.values()} | {0})
    rows = []
    for method in (*TRAINED, "none"):
        named = {t: m for m, (meth, t) in models.items() if meth == method}
        for t in points:
            name = start[0] if t == 0 or method == "none" else named.get(t)
            if name is not None:
                rows.append({"run": method, "step": t, "model": name, **wide.loc[name]})
    table = pd.DataFrame(rows)
    columns = [f"{display(m)}_{agg}" for agg in ("all", "avg") for m in metrics]
    if table["step"].max() != steps:
        raise ValueError(
            f"models: the last evaluation step is {table['step'].max()}, expected steps={steps}"
        )
    return table[["run", "step", "model", *columns]]


def e7_figure(table: pd.DataFrame, extractor: str, *, metric: str = "kd") -> Figure:
    """KD_all against the generator step for the four runs (single column).

    FedSGD (thick, light) and centralized (thin, dark, on top) coincide where the
    gradient identity holds; no fine-tuning is the flat dashed line.
    """
    styles = {
        "fedsgd": {"color": "tab:green", "lw": 3.0, "alpha": 0.45, "marker": "o", "ms": 5},
        "fedavg": {"color": "tab:orange", "lw": 1.2, "marker": "s", "ms": 3},
        "central": {"color": "black", "lw": 0.9, "marker": "x", "ms": 4},
        "none": {"color": "0.5", "lw": 1.0, "ls": "--"},
    }
    name = f"{display(metric)}_all"
    with paper_style():
        fig, axes = new_figure(1, 1, width="single", height=2.6)
        ax = axes[0, 0]
        for method in ("fedsgd", "fedavg", "central", "none"):
            part = table[table["run"] == method]
            ax.plot(part["step"], part[name], label=_LABELS[method], **styles[method])
        gap = _max_relative_gap(table, "fedsgd", "central", name)
        ax.set_xlabel("generator step")
        ax.set_ylabel(metric_label(metric, extractor, "all"))
        ax.set_title(
            f"FedSGD vs centralized: max relative difference {gap:.1g}", loc="left", fontsize=8
        )
        ax.legend(loc="best")
    return fig


def _max_relative_gap(table: pd.DataFrame, a: str, b: str, column: str) -> float:
    x = table[table["run"] == a].set_index("step")[column]
    y = table[table["run"] == b].set_index("step")[column]
    return float(np.max(np.abs(x - y) / np.abs(y)))
