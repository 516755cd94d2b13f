"""E4's sweep: its models (:func:`sweep_models`), config checks, tables and ``run``.

The curves of every score, the FD table of the pre-step
(:mod:`distrank.experiments.e4_diversity_sweep.steps`), the best knobs and the verdict
on Theorem 2; ``run`` reads them and draws the figures
(:mod:`distrank.experiments.e4_diversity_sweep.figures`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

import distrank.metrics._table
from distrank.experiments import Outputs, collected
from distrank.experiments.e4_diversity_sweep.figures import (
    e4_figure,
    e4_samples_figure,
    e4_terms_figure,
)
from distrank.metrics._metric import METRIC_KEYS
from distrank.metrics._registry import HIGHER_IS_BETTER, display
from distrank.metrics.fd._settings import SPLIT, TERMS

__all__ = [
    "SIMULATED",
    "FITTED",
    "FEATURE_KINDS",
    "FAMILY_KINDS",
    "sweep_models",
    "e4_curves",
    "e4_table",
    "mean_curves",
    "fd_curves",
    "theory_table",
    "theorem2_check",
    "run",
]

TABLES = ("", "_curves", "_fd", "_theory", "_theorem2")
FIGURES = ("", "_terms", "_samples")
#: What it reads from scoring, FD at least (its own pre-step recomputes FD's terms);
#: the main table gives every metric that the study scores.
METRICS = ("fd",)

#: Kind of the feature-space family (held-out real features pulled to their class means).
SIMULATED = "simulated"
#: Kind of the family drawn from the clients' Gaussians with scaled covariances.
FITTED = "fitted"
#: Families made in feature space, without a network or images.
FEATURE_KINDS = (SIMULATED, FITTED)
#: Kinds a family may be, the zoo's kinds with a diversity knob and the feature-space ones.
FAMILY_KINDS = ("cgan", "vae", "diffusion", "noise", "blur", "checkpoint", *FEATURE_KINDS)
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
        if spec["kind"] not in FEATURE_KINDS:  # a typo fails here, not in a job's sampler
            zoo.check_knob(spec["kind"], spec["knob"], f"{where}.knob")


def sweep_models(settings: Mapping) -> dict[str, dict]:
    """Every model of the sweep: ``e4-<family>-<value>`` (``-s<seed>`` appended when
    ``settings`` has ``seeds`` > 1) -> ``{family, knob, value, seed, decreasing,
    spec}``; ``spec`` is the family's model spec with the knob set (feature-space
    families: the spec without it). The simulated family has no randomness: it has
    seed 0 only."""
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
                    "spec": base if base["kind"] in FEATURE_KINDS else {**base, fam["knob"]: value},
                }
    return models


def scores(settings: Mapping, config: Mapping) -> tuple[str, list[str]]:
    return settings["partition"], list(sweep_models(settings))


def _model_info(models: Mapping[str, Mapping]) -> pd.DataFrame:
    """One row per sweep model: ``model, family, knob, value, seed, diversity``."""
    return pd.DataFrame(
        [
            {
                "model": name,
                **{k: m[k] for k in ("family", "knob", "value", "seed")},
                "diversity": "decreasing" if m["decreasing"] else "increasing",
            }
            for name, m in models.items()
        ]
    )


def e4_curves(
    scores: pd.DataFrame, models: Mapping[str, Mapping], metrics: Sequence[str] = METRIC_KEYS
) -> pd.DataFrame:
    """Every score of the sweep: ``family, knob, diversity, value, seed, metric,
    aggregation, score`` (metric display names; aggregations ``all`` and ``avg``),
    ordered by family (as in ``models``), metric, aggregation, seed and knob value.
    ``models`` is :func:`sweep_models`."""
    distrank.metrics._table.check(scores, metrics)
    rows = scores[
        scores["aggregation"].isin(["all", "avg"])
        & scores["metric"].isin(metrics)
        & scores["model"].isin(list(models))
    ]
    missing = sorted(set(models) - set(rows["model"]))
    if missing:
        raise ValueError(f"scores have no rows for the sweep models {missing}")
    info = _model_info(models)
    out = rows.merge(info, on="model")
    out = out.rename(columns={"value_x": "score", "value_y": "value"})
    families = list(dict.fromkeys(info["family"]))
    out["family"] = pd.Categorical(out["family"], families, ordered=True)
    out["metric"] = pd.Categorical(out["metric"], list(metrics), ordered=True)
    out = out.sort_values(_CURVE + ["seed", "value"]).reset_index(drop=True)
    out["family"] = out["family"].astype(str)
    out["metric"] = out["metric"].map(display).astype(str)
    return out[["family", "knob", "diversity", "value", "seed", "metric", "aggregation", "score"]]


def fd_curves(fd: pd.DataFrame, models: Mapping[str, Mapping]) -> pd.DataFrame:
    """The pre-step's FD table (``FdSettings.table``)
    with each model's family and knob: ``setting, family, knob, diversity, value, seed,
    aggregation``, FD's terms (``TERMS``,
    ``SPLIT``) and ``fd``, ordered by setting, family,
    aggregation, seed and value."""
    missing = sorted(set(models) - set(fd["model"]))
    if missing:
        raise ValueError(f"the FD table has no rows for the sweep models {missing}")
    out = fd.merge(_model_info(models), on="model")
    order = {k: {v: i for i, v in enumerate(dict.fromkeys(out[k]))} for k in ("setting", "family")}
    out = out.sort_values(
        ["setting", "family", "aggregation", "seed", "value"],
        key=lambda col: col.map(order[col.name]) if col.name in order else col,
    )
    keys = ["setting", "family", "knob", "diversity", "value", "seed", "aggregation"]
    return out[[*keys, *TERMS, SPLIT, "fd"]].reset_index(drop=True)


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
    the score there, the lowest and highest of the seeds' own best values, whether
    the best value is ``interior`` (not an end of the grid), and ``rho_diversity``, the
    Spearman rank correlation of the seed-averaged score with the knob's diversity
    (more diversity should buy Recall and cost Precision, as BigGAN's truncation
    does). Columns ``family, knob, metric, aggregation, best_value, best_score,
    seed_best_min, seed_best_max, interior, n_values, n_seeds, rho_diversity``."""
    from scipy.stats import spearmanr

    higher = {display(k): v for k, v in HIGHER_IS_BETTER.items()}
    rows = []
    for (family, metric, agg), group in curves.groupby(_CURVE, sort=False):
        mean = group.groupby("value")["score"].mean()
        best = _best(mean.to_numpy(float), higher.get(metric, False))
        per_seed = _seed_bests(group, higher.get(metric, False))
        sign = -1 if group["diversity"].iloc[0] == "decreasing" else 1
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
                "rho_diversity": float(spearmanr(sign * mean.index, mean.to_numpy()).statistic),
            }
        )
    return pd.DataFrame(rows)


def theory_table(theory: pd.DataFrame, models: Mapping[str, Mapping]) -> pd.DataFrame:
    """The pre-step's theory (``FdSettings.theory``)
    for each fitted family: ``family, knob, diversity, setting, value, aggregation``,
    FD's terms (``TERMS``) and ``fd``."""
    columns = ["family", "knob", "diversity", "setting", "value", "aggregation", *TERMS, "fd"]
    fitted = {n: m for n, m in models.items() if m["spec"]["kind"] == FITTED}
    if not fitted:
        return pd.DataFrame(columns=columns)
    parts = [
        theory[theory["value"].isin(set(group["value"]))].assign(
            family=family, knob=group["knob"].iloc[0], diversity=group["diversity"].iloc[0]
        )
        for family, group in _model_info(fitted).groupby("family", sort=False)
    ]
    return pd.concat(parts, ignore_index=True)[columns]


def _as_curves(fd: pd.DataFrame) -> pd.DataFrame:
    """FD rows of :func:`fd_curves` (or of the theory, seed 0) as :func:`e4_table`'s curves."""
    return fd.assign(metric="FD", score=fd["fd"], seed=fd.get("seed", 0))


def theorem2_check(fd: pd.DataFrame, theory: pd.DataFrame | None = None) -> pd.DataFrame:
    """The verdict, per family and FD setting (``fd``: :func:`fd_curves`): where FD_all
    and FD_avg are best on the seed-averaged curves and the range of the seeds' own
    best knobs, in how many seeds FD_avg's best knob lies at lower diversity than
    FD_all's (Theorem 2's prediction), at the same or at higher, and ``avg_vs_all``:
    ``"less diverse"``, ``"same"`` or ``"more diverse"`` when every seed agrees, else
    ``"within seed noise"``. Diversity grows with the knob unless the family says
    ``diversity: decreasing`` (guidance). For a fitted family ``theory_all`` and
    ``theory_avg`` are the best knobs of its FD without sampling (``theory``:
    :func:`theory_table`; NaN elsewhere).

    Columns ``family, knob, diversity, setting, best_all, all_seed_min, all_seed_max,
    best_avg, avg_seed_min, avg_seed_max, interior, seeds_less, seeds_same,
    seeds_more, avg_vs_all, theory_all, theory_avg``."""
    rows = []
    for (setting, family), group in fd.groupby(["setting", "family"], sort=False):
        curves = _as_curves(group)
        table = e4_table(curves).set_index("aggregation")
        best = {a: _seed_bests(g, False) for a, g in curves.groupby("aggregation")}
        sign = -1 if group["diversity"].iloc[0] == "decreasing" else 1
        shifts = sign * np.sign(best["avg"] - best["all"])
        counts = {k: int((shifts == v).sum()) for k, v in (("less", -1), ("same", 0), ("more", 1))}
        verdict = [k for k, n in counts.items() if n == len(shifts)]
        exact = {"all": np.nan, "avg": np.nan}
        if theory is not None:
            mine = theory[(theory["family"] == family) & (theory["setting"] == setting)]
            if len(mine):
                exact = e4_table(_as_curves(mine)).set_index("aggregation")["best_value"]
        rows.append(
            {
                "family": family,
                "knob": group["knob"].iloc[0],
                "diversity": group["diversity"].iloc[0],
                "setting": setting,
                **{
                    col: table.loc[agg, key]
                    for agg in ("all", "avg")
                    for col, key in (
                        (f"best_{agg}", "best_value"),
                        (f"{agg}_seed_min", "seed_best_min"),
                        (f"{agg}_seed_max", "seed_best_max"),
                    )
                },
                "interior": bool(table["interior"].all()),
                **{f"seeds_{k}": n for k, n in counts.items()},
                "avg_vs_all": {"less": "less diverse", "same": "same", "more": "more diverse"}[
                    verdict[0]
                ]
                if verdict
                else "within seed noise",
                "theory_all": float(exact["all"]),
                "theory_avg": float(exact["avg"]),
            }
        )
    return pd.DataFrame(rows)


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    from distrank.data.images import load_images

    models = sweep_models(settings)
    scored = context["metrics"].get("metrics", METRIC_KEYS)
    curves = e4_curves(collected(inputs, context), models, scored)
    fd = fd_curves(pd.read_csv(inputs["fd"]), models)
    theory = theory_table(pd.read_csv(inputs["theory"]), models)
    verdict = theorem2_check(fd, theory)
    samples = {}
    for path in inputs.get("images", []):
        name = str(path).rsplit("/", 1)[-1].removeprefix("model_").removesuffix(".npz")
        if models[name]["seed"] == 0:
            samples[name] = load_images(path)[0][:12]
    figures = {
        "": e4_figure(fd, theory, context["extractor"]),
        "_terms": e4_terms_figure(fd, context["extractor"]),
        "_samples": e4_samples_figure(samples, models),
    }
    tables = {"": e4_table(curves), "_curves": curves, "_fd": fd, "_theory": theory}
    return Outputs({**tables, "_theorem2": verdict}, figures)
