r"""E4: a diversity knob on variance-limited clients (one class per client).

Each *family* is one model swept over one knob that trades diversity for typicality:
the GAN's truncation :math:`\psi`, the VAE's temperature, the diffusion model's
guidance scale (diversity falls as guidance grows), a published checkpoint's
truncation at full scale, and a *simulated* family with a known answer, held-out
real features pulled toward their class means in feature space (no network),

.. math::  x' = \mu_c + \tau\,(x - \mu_c), \qquad \tau = 1 \text{ is the real data}.

For every knob value, metric and aggregation the score is read from the pipeline's
scoring (clients score locally, the server averages; the pool is scored centrally),
and the table gives the best knob (argmin for distances, argmax for PRDC) of the
curve averaged over ``seeds`` sampling seeds, and the spread of each seed's best knob.
Theorem 1
makes the KD gap the same for every model, so KD_all and KD_avg pick the same knob;
Theorem 2 predicts that on variance-limited clients FD_avg, minimised by the
Wasserstein barycenter of the client Gaussians (no between-client spread), prefers
*less* diversity than FD_all, minimised by the pooled Gaussian
(paper.md, "Facts derived from the theory"): the per-family table says whether it
does in every seed (beyond seed noise), and how Precision and Recall follow the knob
(Spearman rank correlation with its diversity, as they do for BigGAN's truncation).

Generated families sample only the classes that the clients hold (balanced), so that
the knob, not the missing classes, is what the scores see; the simulated family uses
the held-out rows of those classes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from distrank.experiments import Job, Outputs, check_scores, collected
from distrank.figures import DOUBLE_COLUMN_IN, metric_label, new_figure, paper_style
from distrank.metrics.registry import HIGHER_IS_BETTER, METRIC_KEYS, display

__all__ = [
    "SIMULATED",
    "FAMILY_KINDS",
    "sweep_models",
    "sweep_inputs",
    "partition_classes",
    "pull_to_class_means",
    "write_sweep",
    "e4_curves",
    "e4_table",
    "mean_curves",
    "theorem2_check",
    "e4_figure",
    "e4_samples_figure",
    "run",
]

TABLES = ("", "_curves", "_theorem2")
FIGURES = ("", "_samples")

#: Kind of the feature-space family: held-out real features pulled to their class means.
SIMULATED = "simulated"
#: Kinds a family may be: the zoo's kinds with a diversity knob, and the simulated one.
FAMILY_KINDS = ("cgan", "vae", "diffusion", "noise", "blur", "checkpoint", SIMULATED)
#: Keys of a family that describe the sweep; the rest is the spec of its models.
_SWEEP_KEYS = ("knob", "values", "diversity")
#: The curve keys of one sweep: a family's scores of one metric and aggregation.
_CURVE = ["family", "metric", "aggregation"]


def check(settings: Mapping, config: Mapping) -> None:
    """Every family's knob values are distinct; a family of zoo kind is trained."""
    from distrank import zoo

    for family, spec in settings["families"].items():
        where = f"config: experiments.E4.families.{family}"
        if len(set(spec["values"])) != len(spec["values"]):
            raise ValueError(f"{where}.values: repeated knob values {spec['values']}")
        if spec["kind"] in zoo.FAMILIES and spec["kind"] not in config.get("zoo", {}):
            raise ValueError(f"{where}.kind is {spec['kind']!r}, but zoo.{spec['kind']} is not set")
        if spec["kind"] == SIMULATED and "heldout" not in config:
            raise ValueError(
                f"{where}: the simulated family pulls held-out features, but "
                "the config has no heldout"
            )
        if spec["kind"] not in FAMILY_KINDS:
            raise ValueError(f"{where}.kind: unknown {spec['kind']!r}")


def sweep_models(settings: Mapping) -> dict[str, dict]:
    """Every model of the sweep: ``e4-<family>-<value>`` (``-s<seed>`` appended when
    ``settings`` has ``seeds`` > 1) -> ``{family, knob, value, seed, decreasing,
    spec}``; ``spec`` is the family's model spec with the knob set. The simulated
    family has no randomness: it has seed 0 only."""
    n_seeds = settings.get("seeds", 1)
    models = {}
    for family, fam in settings["families"].items():
        base = {k: v for k, v in fam.items() if k not in _SWEEP_KEYS}
        seeds = range(1 if base["kind"] == SIMULATED else n_seeds)
        for value in fam["values"]:
            for seed in seeds:
                name = f"e4-{family}-{value:g}" + (f"-s{seed}" if n_seeds > 1 else "")
                models[name] = {
                    "family": family,
                    "knob": fam["knob"],
                    "value": float(value),
                    "seed": seed,
                    "decreasing": fam.get("diversity", "increasing") == "decreasing",
                    "spec": {**base, fam["knob"]: value} if base["kind"] != SIMULATED else base,
                }
    return models


def scores(settings: Mapping, config: Mapping) -> tuple[str, list[str]]:
    return settings["partition"], list(sweep_models(settings))


def sweep_inputs(settings: Mapping, model_files, heldout_features: str) -> dict[str, str]:
    """What the sweep's families are made from, as :func:`write_sweep` reads it: each
    family's files by ``model_files(spec)`` (the workflow's, e.g. ``{"state": path}``)
    named ``<name>_<family>`` (``heldout``, shared, keeps its name), and
    ``heldout_features`` for the simulated family."""
    inputs = {}
    for family, spec in settings["families"].items():
        if spec["kind"] == SIMULATED:
            inputs["heldout_features"] = heldout_features
            continue
        for name, path in model_files(spec).items():
            inputs[name if name == "heldout" else f"{name}_{family}"] = path
    return inputs


def partition_classes(scheme: Mapping) -> list[int] | None:
    """The classes that a partition's clients hold (``None``: all of them, or unknown)."""
    if scheme["kind"] == "one_class":
        return scheme.get("classes")
    if scheme["kind"] == "by_class":
        return sorted(c for group in scheme["groups"] for c in group)
    return None


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


def write_sweep(
    settings: Mapping,
    inputs: Mapping,
    outputs: Mapping,
    *,
    n_samples: int,
    seed: int,
    classes: Sequence[int] | None,
    features: Mapping,
    batch_size: int,
    device=None,
    trust_pickles: bool = False,
    threads: int = 1,
) -> None:
    """Pre-step (one job): the images and features of every sweep model.

    ``inputs`` holds ``state_<family>`` (a trained zoo state), ``checkpoint_<family>``
    and ``code_<family>`` (a published network), ``heldout`` (held-out images) and
    ``heldout_features`` (for the simulated family) as the families need;
    ``outputs`` maps each model to its ``images`` (image families) and ``features``
    paths. Every knob value of a family uses the same seed (shared latents): ``seed``
    plus the model's sampling seed.
    """
    from distrank import zoo
    from distrank._io import atomic_path
    from distrank.data.images import save_images
    from distrank.features import extractor_from_config
    from distrank.features.cache import extract_to_file, load_features, read_array

    extractor = None
    states = {}
    for name, model in sweep_models(settings).items():
        spec, family = dict(model["spec"]), model["family"]
        kind = spec["kind"]
        if kind == SIMULATED:
            x = load_features(inputs["heldout_features"])
            labels = read_array(inputs["heldout_features"], key="labels")
            if classes is not None:
                keep = np.isin(labels, classes)
                x, labels = x[keep], labels[keep]
            with atomic_path(outputs[name]["features"]) as tmp:
                np.savez(
                    tmp, features=pull_to_class_means(x, labels, model["value"]), labels=labels
                )
            continue
        if kind in zoo.FAMILIES:
            if family not in states:
                states[family] = zoo.load_state(inputs[f"state_{family}"])
            state = states[family]
            labels = None if classes is None else np.resize(np.asarray(classes), n_samples)
            knobs = {k: v for k, v in spec.items() if k != "kind"}
            images, labels = zoo.sample(
                state, n_samples, seed=seed + model["seed"], labels=labels, threads=threads, **knobs
            )
        else:
            own = {
                "checkpoint": inputs.get(f"checkpoint_{family}"),
                "code": inputs.get(f"code_{family}"),
                "heldout": inputs.get("heldout"),
            }
            images, labels = zoo.make_images(
                spec,
                n_samples,
                seed=seed + model["seed"],
                inputs=own,
                batch_size=batch_size,
                device=device,
                trust_pickles=trust_pickles,
                name=name,
            )
        save_images(outputs[name]["images"], images, labels, model=name, spec=spec)
        if extractor is None:  # loaded once for the whole sweep
            extractor = extractor_from_config(features, device=device, threads=threads)
        extract_to_file(
            outputs[name]["images"],
            outputs[name]["features"],
            extractor,
            batch_size=features["batch_size"],
        )


def sweep_centralized(job: Job) -> None:
    """Pre-step ``e4_sweep_models``: :func:`write_sweep` on the rule's files."""
    params = job.params
    outputs = {m: {"features": path} for m, path in zip(params["models"], job.outputs["features"])}
    for name, path in zip(params["image_models"], job.outputs["images"]):
        outputs[name]["images"] = path
    write_sweep(
        params["settings"],
        job.inputs,
        outputs,
        n_samples=params["n_samples"],
        seed=params["seed"],
        classes=params["classes"],
        features=params["features"],
        batch_size=params["batch_size"],
        device=params["device"],
        trust_pickles=params["trust_pickles"],
        threads=job.threads,
    )


STEPS = {"e4_sweep_models": sweep_centralized}


def e4_curves(
    scores: pd.DataFrame, models: Mapping[str, Mapping], metrics: Sequence[str] = METRIC_KEYS
) -> pd.DataFrame:
    """Every score of the sweep: ``family, knob, value, seed, metric, aggregation,
    score`` (metric display names; aggregations ``all`` and ``avg``), ordered by
    family (as in ``models``), metric, aggregation, seed and knob value. ``models`` is
    :func:`sweep_models`."""
    check_scores(scores, metrics)
    rows = scores[
        scores["aggregation"].isin(["all", "avg"])
        & scores["metric"].isin(metrics)
        & scores["model"].isin(list(models))
    ]
    missing = sorted(set(models) - set(rows["model"]))
    if missing:
        raise ValueError(f"scores have no rows for the sweep models {missing}")
    info = pd.DataFrame(
        [
            {"model": name, **{k: m[k] for k in ("family", "knob", "value", "seed")}}
            for name, m in models.items()
        ]
    )
    out = rows.merge(info, on="model")
    out = out.rename(columns={"value_x": "score", "value_y": "value"})
    families = list(dict.fromkeys(info["family"]))
    out["family"] = pd.Categorical(out["family"], families, ordered=True)
    out["metric"] = pd.Categorical(out["metric"], list(metrics), ordered=True)
    out = out.sort_values(_CURVE + ["seed", "value"]).reset_index(drop=True)
    out["family"] = out["family"].astype(str)
    out["metric"] = out["metric"].map(display).astype(str)
    return out[["family", "knob", "value", "seed", "metric", "aggregation", "score"]]


def mean_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """:func:`e4_curves` averaged over the seeds: ``family, knob, value, metric,
    aggregation, score``, in the same order."""
    keys = _CURVE + ["knob", "value"]
    return curves.groupby(keys, sort=False, as_index=False)["score"].mean()[
        ["family", "knob", "value", "metric", "aggregation", "score"]
    ]


def _best(scores_: np.ndarray, higher: bool) -> int:
    """Index of the best score (the first among ties)."""
    return int(np.argmax(scores_) if higher else np.argmin(scores_))


def _seed_bests(curve: pd.DataFrame, higher: bool) -> pd.Series:
    """Each seed's best knob value of one curve (the lowest value among ties), by seed."""
    return (
        curve.sort_values("value")
        .groupby("seed")
        .apply(lambda g: float(g["value"].iloc[_best(g["score"].to_numpy(float), higher)]))
    )


def e4_table(curves: pd.DataFrame) -> pd.DataFrame:
    """Per family, metric and aggregation: the best knob value of the seed-averaged
    curve (argmin for distances, argmax for PRDC; the lowest knob value among ties),
    the score there, the lowest and highest of the seeds' own best values, and whether
    the best value is ``interior`` (not an end of the grid). Columns ``family, knob,
    metric, aggregation, best_value, best_score, seed_best_min, seed_best_max,
    interior, n_values, n_seeds``."""
    higher = {display(k): v for k, v in HIGHER_IS_BETTER.items()}
    rows = []
    for (family, metric, agg), group in curves.groupby(_CURVE, sort=False):
        mean = group.groupby("value")["score"].mean()
        best = _best(mean.to_numpy(float), higher[metric])
        per_seed = _seed_bests(group, higher[metric])
        rows.append(
            {
                "family": family,
                "knob": group["knob"].iloc[0],
                "metric": metric,
                "aggregation": agg,
                "best_value": float(mean.index[best]),
                "best_score": float(mean.iloc[best]),
                "seed_best_min": min(per_seed),
                "seed_best_max": max(per_seed),
                "interior": 0 < best < len(mean) - 1,
                "n_values": len(mean),
                "n_seeds": len(per_seed),
            }
        )
    return pd.DataFrame(rows)


def theorem2_check(
    curves: pd.DataFrame, models: Mapping[str, Mapping], metric: str = "FD"
) -> pd.DataFrame:
    """Per family: where ``<metric>_all`` and ``<metric>_avg`` are best (on the
    seed-averaged curves), in how many seeds avg's best knob lies at lower diversity
    than all's (Theorem 2's prediction for FD), at the same or at higher, and the
    verdict: ``"less diverse"``, ``"same"`` or ``"more diverse"`` when every seed
    agrees, else ``"within seed noise"``. Diversity grows with the knob unless the
    family says ``diversity: decreasing`` (guidance). ``rho_recall`` and
    ``rho_precision`` are the Spearman rank correlations of the knob's diversity with
    the seed-averaged Recall_all and Precision_all (NaN without those metrics).

    Columns ``family, knob, diversity, best_all, best_avg, interior, seeds_less,
    seeds_same, seeds_more, avg_vs_all, rho_recall, rho_precision``."""
    from scipy.stats import spearmanr

    decreasing = {m["family"]: m["decreasing"] for m in models.values()}
    fd = curves[curves["metric"] == metric]
    table = e4_table(fd).set_index(["family", "aggregation"])
    mean = mean_curves(curves[curves["aggregation"] == "all"])
    rows = []
    for family in dict.fromkeys(curves["family"]):
        sign = -1 if decreasing[family] else 1
        b_all, b_avg = table.loc[(family, "all")], table.loc[(family, "avg")]
        best = {
            a: _seed_bests(g, False) for a, g in fd[fd["family"] == family].groupby("aggregation")
        }
        shifts = sign * np.sign(best["avg"] - best["all"])
        counts = {k: int((shifts == v).sum()) for k, v in (("less", -1), ("same", 0), ("more", 1))}
        verdict = [k for k, n in counts.items() if n == len(shifts)]
        rho = {}
        for name in ("Recall", "Precision"):
            curve = mean[(mean["family"] == family) & (mean["metric"] == name)]
            rho[name] = (
                float(spearmanr(sign * curve["value"], curve["score"]).statistic)
                if len(curve)
                else float("nan")
            )
        rows.append(
            {
                "family": family,
                "knob": b_all["knob"],
                "diversity": "decreasing" if decreasing[family] else "increasing",
                "best_all": b_all["best_value"],
                "best_avg": b_avg["best_value"],
                "interior": bool(b_all["interior"] and b_avg["interior"]),
                "seeds_less": counts["less"],
                "seeds_same": counts["same"],
                "seeds_more": counts["more"],
                "avg_vs_all": {"less": "less diverse", "same": "same", "more": "more diverse"}[
                    verdict[0]
                ]
                if verdict
                else "within seed noise",
                "rho_recall": rho["Recall"],
                "rho_precision": rho["Precision"],
            }
        )
    return pd.DataFrame(rows)


_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]


def e4_figure(curves: pd.DataFrame, table: pd.DataFrame, extractor: str) -> Figure:
    """One panel per metric (``curves``: :func:`mean_curves`): each curve's distance from its best score as a share of
    its range, ``|score - best| / (max - min)`` over the knob values (0 at the best
    value, 1 at the worst), so that curves of very different levels share a panel; one
    colour per family, ``all`` solid and ``avg`` dashed, the best values marked (a dot
    for all, a cross for avg). The families' knobs share the x axis (each spans its own
    values); the levels are in the table. KD's two curves coincide: the gap is the
    same for every model (Theorem 1)."""
    from matplotlib.lines import Line2D

    metrics = list(dict.fromkeys(curves["metric"]))
    families = list(dict.fromkeys(curves["family"]))
    knobs = dict(zip(curves["family"], curves["knob"]))
    colors = dict(zip(families, _COLORS))
    keys = {display(k): k for k in METRIC_KEYS}
    ncols = 3
    nrows = -(-len(metrics) // ncols)
    with paper_style():
        fig, axes = new_figure(nrows, ncols, width="double", height=2.0 * nrows + 0.6)
        for ax in axes.flat[len(metrics) :]:
            ax.set_visible(False)
        for ax, metric in zip(axes.flat, metrics):
            for family in families:
                for agg, ls, marker in (("all", "-", "o"), ("avg", "--", "x")):
                    rows = curves[
                        (curves["family"] == family)
                        & (curves["metric"] == metric)
                        & (curves["aggregation"] == agg)
                    ]
                    best = table[
                        (table["family"] == family)
                        & (table["metric"] == metric)
                        & (table["aggregation"] == agg)
                    ].iloc[0]
                    span = float(rows["score"].max() - rows["score"].min()) or 1.0
                    ax.plot(
                        rows["value"],
                        (rows["score"] - best["best_score"]).abs() / span,
                        ls=ls,
                        color=colors[family],
                        lw=1.0,
                    )
                    ax.plot(
                        best["best_value"],
                        0.0,
                        marker=marker,
                        ms=5,
                        mew=1.2,
                        color=colors[family],
                        zorder=3,
                        clip_on=False,
                    )
            ax.set_xlabel("knob value")
            shown, where = metric_label(keys.get(metric, metric), extractor).split(" on ", 1)
            ax.set_ylabel(f"{shown}: |score $-$ best| / range\non {where}")
            ax.set_ylim(0.0, 1.04)
        handles = [Line2D([], [], color=colors[f], label=f"{f} ({knobs[f]})") for f in families]
        handles += [
            Line2D([], [], color="0.3", ls="-", marker="o", ms=4, label="all, best"),
            Line2D([], [], color="0.3", ls="--", marker="x", ms=4, mew=1.2, label="avg, best"),
        ]
        fig.legend(handles=handles, loc="outside lower center", ncols=3)
    return fig


def e4_samples_figure(
    samples: Mapping[str, np.ndarray], models: Mapping[str, Mapping], per_row: int = 12
) -> Figure:
    """Samples of each image family (one panel per family), one row per knob value:
    the first ``per_row`` images of each sweep model. ``samples`` maps model names to
    uint8 images (N, H, W) or (N, H, W, C)."""
    families = list(dict.fromkeys(models[name]["family"] for name in samples))
    if not families:  # a sweep of feature-space families only
        with paper_style():
            fig, axes = new_figure(1, 1, width="single", height=0.6)
            axes[0, 0].set_axis_off()
            axes[0, 0].text(0.5, 0.5, "no image family in this sweep", ha="center")
        return fig
    rows_most = max(sum(models[n]["family"] == f for n in samples) for f in families)
    panel = DOUBLE_COLUMN_IN / len(families)
    with paper_style():
        fig, axes = new_figure(
            1, len(families), width="double", height=panel * rows_most / per_row + 0.55
        )
        for ax, family in zip(axes.flat, families):
            names = [n for n in samples if models[n]["family"] == family]
            rows = [np.concatenate(list(_as_rgb(samples[n][:per_row])), axis=1) for n in names]
            ax.imshow(
                np.concatenate(rows, axis=0), cmap="gray", vmin=0, vmax=255, interpolation="nearest"
            )
            side = samples[names[0]].shape[1]
            ax.set_yticks(
                [side * (i + 0.5) for i in range(len(names))],
                [f"{models[n]['value']:g}" for n in names],
            )
            ax.set_xticks([])
            ax.set_ylabel(models[names[0]]["knob"])
            ax.set_title(family, loc="left")
            ax.set_anchor("N")  # panels of fewer rows hang from the same top line
            for spine in ax.spines.values():
                spine.set_visible(False)
    return fig


def _as_rgb(images: np.ndarray) -> np.ndarray:
    """(N, H, W) or (N, H, W, 1) grey, or (N, H, W, 3) colour, as imshow takes them."""
    return images[..., 0] if images.ndim == 4 and images.shape[-1] == 1 else images


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    from distrank.data.images import load_images

    models = sweep_models(settings)
    curves = e4_curves(collected(inputs, context), models)
    table = e4_table(curves)
    samples = {}
    for path in inputs.get("images", []):
        name = str(path).rsplit("/", 1)[-1].removeprefix("model_").removesuffix(".npz")
        if models[name]["seed"] == 0:
            samples[name] = load_images(path)[0][:12]
    figures = {
        "": e4_figure(mean_curves(curves), table, context["extractor"]),
        "_samples": e4_samples_figure(samples, models),
    }
    return Outputs(
        {"": table, "_curves": curves, "_theorem2": theorem2_check(curves, models)}, figures
    )
