r"""E4: a diversity knob on variance-limited clients (one class per client).

Each *family* is one model swept over one knob that trades diversity for typicality:
the GAN's truncation :math:`\psi`, the VAE's temperature, the diffusion model's
guidance scale (diversity falls as guidance grows), a published checkpoint's
truncation at full scale, and two families computed in feature space (no network):
*simulated*, held-out real features pulled toward their class means,

.. math::  x' = \mu_c + \tau\,(x - \mu_c), \qquad \tau = 1 \text{ is the real data},

and *fitted*, Theorem 2's own setting on the clients' statistics: client i's share
:math:`\lambda_i` of the samples drawn from :math:`N(\mu_i, s\,C_i)`, :math:`\mu_i, C_i`
the mean and covariance of its rows
(:func:`~distrank.zoo.feature_space.fitted_samples`), so that the model's
Gaussian is :math:`N(\bar\mu, sW + B)` (:math:`W = \sum_i \lambda_i C_i`, :math:`B` the
between-client covariance): FD_all is least at :math:`s = 1`, and FD_avg's least
:math:`s` follows in closed form (the ``_theory`` table).

For every knob value, metric and aggregation the score is read from the pipeline's
scoring (clients score locally, the server averages; the pool is scored centrally),
and the table gives the best knob (argmin for distances, argmax for PRDC) of the
curve averaged over ``seeds`` sampling seeds, the spread of each seed's best knob, and
the Spearman correlation of the curve with the knob's diversity. Theorem 1 makes the
KD gap the same for every model, so KD_all and KD_avg pick the same knob. Theorem 2
predicts that on variance-limited clients FD_avg, minimised by the Wasserstein
barycenter of the client Gaussians (no between-client spread), prefers *less*
diversity than FD_all, minimised by the pooled Gaussian (paper.md, "Facts derived from
the theory"). If a knob scaled the model's covariance, :math:`C_Y = sA`, and left its
mean alone, the best scales would be :math:`s^*_\mathrm{all} = (f(\bar C)/\operatorname{tr}A)^2`
and :math:`s^*_\mathrm{avg} = (\sum_i \lambda_i f(C_i)/\operatorname{tr}A)^2` with
:math:`f(C) = \operatorname{tr}(A^{1/2} C A^{1/2})^{1/2}`, concave and monotone, so
:math:`s^*_\mathrm{avg} \le s^*_\mathrm{all}` always.

FD is estimated from samples, with a bias that depends on the sample sizes and on the
spectrum, so on the knob. The centralized pre-step
(:class:`~distrank.metrics.fd_settings.FdSettings`) computes FD in
several *settings*: ``features`` (as scored), ``pca<d>`` (features projected on the
pool's first d principal axes, where the samples exceed d many times) and
``extrapolated`` (FD at several sample sizes, a line in 1/m, its intercept), with
FD's terms (the mean term, tr C_Y and the root term
:math:`\operatorname{tr}(C_X^{1/2} C_Y C_X^{1/2})^{1/2}`: FD_all and FD_avg differ only by
constants and by the root term). The verdict table (``_theorem2``) says, per family and
setting, where FD_all and FD_avg are best, over how many seeds FD_avg's best knob is
less, as or more diverse than FD_all's, and (fitted family) where the theory puts them.

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
from distrank.figures import DOUBLE_COLUMN_IN, metric_name, new_figure, paper_style
from distrank.metrics.fd_settings import EXTRAPOLATED, FEATURES, SPLIT, TERMS, FdSettings
from distrank.metrics.registry import HIGHER_IS_BETTER, METRIC_KEYS, display
from distrank.zoo.feature_space import fitted_samples, pull_to_class_means

__all__ = [
    "SIMULATED",
    "FITTED",
    "FEATURE_KINDS",
    "FAMILY_KINDS",
    "sweep_models",
    "sweep_inputs",
    "partition_classes",
    "write_sweep",
    "write_fitted",
    "write_fd",
    "e4_curves",
    "e4_table",
    "mean_curves",
    "fd_curves",
    "theory_table",
    "theorem2_check",
    "e4_figure",
    "e4_terms_figure",
    "e4_samples_figure",
    "run",
]

TABLES = ("", "_curves", "_fd", "_theory", "_theorem2")
FIGURES = ("", "_terms", "_samples")
#: What it reads from scoring: FD at least (its own pre-step recomputes FD's terms);
#: the main table gives every metric that the study scores.
METRICS = ("fd",)

#: Kind of the feature-space family: held-out real features pulled to their class means.
SIMULATED = "simulated"
#: Kind of the family drawn from the clients' Gaussians with scaled covariances.
FITTED = "fitted"
#: Families made in feature space, without a network or images.
FEATURE_KINDS = (SIMULATED, FITTED)
#: Kinds a family may be: the zoo's kinds with a diversity knob, and the feature-space ones.
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


def sweep_inputs(settings: Mapping, model_files, heldout_features: str) -> dict[str, str]:
    """What the sweep's families are made from, as :func:`write_sweep` reads it: each
    family's files by ``model_files(spec)`` (the workflow's, e.g. ``{"state": path}``)
    named ``<name>_<family>`` (``heldout``, shared, keeps its name), and
    ``heldout_features`` for the simulated family (the fitted family has its own
    pre-step, :func:`write_fitted`)."""
    inputs = {}
    for family, spec in settings["families"].items():
        if spec["kind"] == SIMULATED:
            inputs["heldout_features"] = heldout_features
        if spec["kind"] in FEATURE_KINDS:
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
    """Pre-step (one job): the images and features of every sweep model but the
    fitted family's (:func:`write_fitted`).

    ``inputs`` holds ``state_<family>`` (a trained zoo state), ``checkpoint_<family>``
    and ``code_<family>`` (a published network), ``heldout`` (held-out images) and
    ``heldout_features`` (for the simulated family) as the families need;
    ``outputs`` maps each model to its ``images`` (image families) and ``features``
    paths. Every knob value of a family uses the same seed (shared latents): ``seed``
    plus the model's sampling seed.
    """
    from distrank import zoo
    from distrank.data.images import save_images
    from distrank.features import extractor_from_config
    from distrank.features.cache import extract_to_file

    extractor = None
    states = {}
    for name, model in sweep_models(settings).items():
        spec, family = dict(model["spec"]), model["family"]
        kind = spec["kind"]
        if kind in FEATURE_KINDS:
            if kind == SIMULATED:
                _write_simulated(inputs["heldout_features"], classes, model["value"], outputs[name])
            continue
        own = {
            "checkpoint": inputs.get(f"checkpoint_{family}"),
            "code": inputs.get(f"code_{family}"),
            "heldout": inputs.get("heldout"),
        }
        sampling = {}
        if kind in zoo.FAMILIES:  # one state per family, class-conditional on the clients'
            if family not in states:
                states[family] = zoo.load_state(inputs[f"state_{family}"])
            labels = None if classes is None else np.resize(np.asarray(classes), n_samples)
            sampling = {"state": states[family], "labels": labels, "threads": threads}
        images, labels = zoo.make_images(
            spec,
            n_samples,
            seed=seed + model["seed"],
            inputs=own,
            batch_size=batch_size,
            device=device,
            trust_pickles=trust_pickles,
            name=name,
            **sampling,
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


def _write_simulated(heldout_path, classes, tau: float, output: Mapping) -> None:
    """The simulated family's features at ``tau``: the held-out rows of ``classes``
    pulled to their class means
    (:func:`~distrank.zoo.feature_space.pull_to_class_means`), with their labels."""
    from distrank._io import atomic_path
    from distrank.features.cache import load_features, read_array

    x, labels = load_features(heldout_path), read_array(heldout_path, key="labels")
    if classes is not None:
        keep = np.isin(labels, classes)
        x, labels = x[keep], labels[keep]
    with atomic_path(output["features"]) as tmp:
        np.savez(tmp, features=pull_to_class_means(x, labels, tau), labels=labels)


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


# -- The fitted family: Theorem 2's own setting on the clients' statistics ------------


def write_fitted(
    settings: Mapping,
    client_paths: Sequence,
    outputs: Mapping[str, str],
    *,
    n_samples: int,
    seed: int,
    weights: str,
) -> None:
    """Pre-step: the features of every fitted-family model,
    :func:`~distrank.zoo.feature_space.fitted_samples` of the clients' files, to
    ``outputs[name]``; seed ``seed`` plus the model's sampling seed, as the image
    families."""
    from distrank._io import atomic_path
    from distrank.features.cache import load_features

    clients = [load_features(p) for p in client_paths]
    fitted = {n: m for n, m in sweep_models(settings).items() if m["spec"]["kind"] == FITTED}
    for family, draw_seed in dict.fromkeys((m["family"], m["seed"]) for m in fitted.values()):
        mine = {n: m for n, m in fitted.items() if (m["family"], m["seed"]) == (family, draw_seed)}
        draws = fitted_samples(
            clients,
            [m["value"] for m in mine.values()],
            n_samples=n_samples,
            seed=seed + draw_seed,
            weights=weights,
        )
        for name, model in mine.items():
            features, labels = draws[model["value"]]
            with atomic_path(outputs[name]) as tmp:
                np.savez(tmp, features=features, labels=labels)


def fitted_centralized(job: Job) -> None:
    """Pre-step ``e4_fitted_centralized``: :func:`write_fitted` on the rule's files."""
    params = job.params
    write_fitted(
        params["settings"],
        job.inputs["clients"],
        dict(zip(params["models"], job.outputs["features"])),
        n_samples=params["n_samples"],
        seed=params["seed"],
        weights=params["weights"],
    )


# -- FD estimated well: PCA projections, extrapolation to infinite samples, its terms --


def write_fd(
    settings: Mapping,
    client_paths: Sequence,
    model_paths: Mapping[str, str],
    fd_path,
    theory_path,
    *,
    weights: str,
    seed: int,
    threads: int = 1,
) -> None:
    """Pre-step: :meth:`~distrank.metrics.fd_settings.FdSettings.table` of every sweep
    model (``fd_path``) and :meth:`~distrank.metrics.fd_settings.FdSettings.theory` at
    the fitted families' scales (``theory_path``), CSV."""
    from distrank._io import atomic_open
    from distrank.features.cache import load_features, load_labelled
    from distrank.zoo import torch_session

    models = sweep_models(settings)
    scales = sorted({m["value"] for m in models.values() if m["spec"]["kind"] == FITTED})
    with torch_session(seed, threads):
        fd = FdSettings(
            [load_features(p) for p in client_paths],
            pca_dims=settings.get("pca_dims", []),
            extrapolation=settings.get("extrapolation"),
            weights=weights,
            seed=seed,
        )
        table = fd.table((name, *load_labelled(model_paths[name])) for name in models)
        theory = fd.theory(scales)
    for path, frame in ((fd_path, table), (theory_path, theory)):
        with atomic_open(path, "w") as f:
            frame.to_csv(f, index=False, lineterminator="\n")


def fd_centralized(job: Job) -> None:
    """Pre-step ``e4_fd_centralized``: :func:`write_fd` on the rule's files."""
    params = job.params
    write_fd(
        params["settings"],
        job.inputs["clients"],
        dict(zip(params["models"], job.inputs["models"])),
        job.outputs["fd"],
        job.outputs["theory"],
        weights=params["weights"],
        seed=params["seed"],
        threads=job.threads,
    )


STEPS = {
    "e4_sweep_models": sweep_centralized,
    "e4_fitted_centralized": fitted_centralized,
    "e4_fd_centralized": fd_centralized,
}


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
    check_scores(scores, metrics)
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
    """The pre-step's FD table (:meth:`~distrank.metrics.fd_settings.FdSettings.table`)
    with each model's family and knob: ``setting, family, knob, diversity, value, seed,
    aggregation``, FD's terms (:data:`~distrank.metrics.fd_settings.TERMS`,
    :data:`~distrank.metrics.fd_settings.SPLIT`) and ``fd``, ordered by setting, family,
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
    """The pre-step's theory (:meth:`~distrank.metrics.fd_settings.FdSettings.theory`)
    for each fitted family: ``family, knob, diversity, setting, value, aggregation``,
    FD's terms (:data:`~distrank.metrics.fd_settings.TERMS`) and ``fd``."""
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


_AGG_STYLE = {
    "all": {"color": "tab:blue", "ls": "-", "marker": "o"},
    "avg": {"color": "tab:orange", "ls": "--", "marker": "s"},
}


def _setting_label(setting: str, extractor: str) -> str:
    """How a setting names FD on an axis."""
    fd = metric_name("fd", extractor)
    if setting.startswith("pca"):
        return f"{fd}, PCA to {setting[3:]} dims"
    return {FEATURES: f"{fd} as scored", EXTRAPOLATED: rf"{fd}$_\infty$ (line in 1/m)"}.get(
        setting, f"{fd}, {setting}"
    )


def _grid(fd: pd.DataFrame, height_per_row: float):
    """A figure with one row per setting and one column per family of ``fd``."""
    settings = list(dict.fromkeys(fd["setting"]))
    families = list(dict.fromkeys(fd["family"]))
    fig, axes = new_figure(
        len(settings),
        len(families),
        width="double",
        height=height_per_row * len(settings) + 0.7,
        sharex="col",
    )
    return fig, axes, settings, families


def _knob_axis(ax, group: pd.DataFrame, last_row: bool) -> None:
    if last_row:
        arrow = "less" if group["diversity"].iloc[0] == "decreasing" else "more"
        ax.set_xlabel(f"{group['knob'].iloc[0]}\n({arrow} diverse →)")


def e4_figure(fd: pd.DataFrame, theory: pd.DataFrame, extractor: str) -> Figure:
    """FD_all (solid) and FD_avg (dashed) against the knob, one row per FD setting and
    one column per family (``fd``: :func:`fd_curves`): the seeds' mean with the band
    of the lowest to highest seed, the best knob of each mean curve marked (a filled
    marker), and for a fitted family its FD without sampling (thin grey, ``theory``:
    :func:`theory_table`) with its best knobs (open markers). Both aggregations
    share one y axis, so the gap FD_avg - FD_all shows."""
    from matplotlib.lines import Line2D

    with paper_style():
        fig, axes, settings, families = _grid(fd, 1.45)
        for r, setting in enumerate(settings):
            for c, family in enumerate(families):
                ax = axes[r, c]
                mine = fd[(fd["setting"] == setting) & (fd["family"] == family)]
                exact = theory[(theory["setting"] == setting) & (theory["family"] == family)]
                for agg, style in _AGG_STYLE.items():
                    _curve_with_band(ax, mine[mine["aggregation"] == agg], exact, agg, style)
                _knob_axis(ax, mine, r == len(settings) - 1)
                if r == 0:
                    ax.set_title(family, loc="left")
                if c == 0:
                    ax.set_ylabel(_setting_label(setting, extractor))
        name, band = display("fd", extractor), ", seeds' band" if fd["seed"].nunique() > 1 else ""
        handles = [
            Line2D([], [], color=s["color"], ls=s["ls"], label=rf"{name}$_\mathrm{{{a}}}${band}")
            for a, s in _AGG_STYLE.items()
        ] + [Line2D([], [], color="0.3", ls="", marker="o", label="best knob (seeds' mean)")]
        if len(theory):  # a fitted family
            handles.append(
                Line2D(
                    [],
                    [],
                    color="0.55",
                    lw=0.8,
                    marker="o",
                    mfc="white",
                    label="fitted: no sampling",
                )
            )
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    return fig


def _curve_with_band(ax, rows: pd.DataFrame, exact: pd.DataFrame, agg: str, style) -> None:
    """One aggregation's seed mean, seeds' band and best knob (and its theory)."""
    by_value = rows.groupby("value")["fd"]
    mean, low, high = by_value.mean(), by_value.min(), by_value.max()
    ax.fill_between(mean.index, low, high, color=style["color"], alpha=0.2, lw=0)
    ax.plot(mean.index, mean, color=style["color"], ls=style["ls"], lw=1.0)
    best = int(np.argmin(mean.to_numpy()))
    ax.plot(mean.index[best], mean.iloc[best], marker=style["marker"], color=style["color"], ms=4)
    exact = exact[exact["aggregation"] == agg].sort_values("value")
    if len(exact):
        ax.plot(exact["value"], exact["fd"], color="0.55", lw=0.8, ls=style["ls"], zorder=1)
        i = int(np.argmin(exact["fd"].to_numpy()))
        ax.plot(
            exact["value"].iloc[i],
            exact["fd"].iloc[i],
            marker=style["marker"],
            mfc="white",
            color=style["color"],
            ms=4,
        )


def e4_terms_figure(fd: pd.DataFrame, extractor: str) -> Figure:
    """What moves the best knob: FD's terms against the knob, each as its change from
    the first knob value (seeds' mean), one row per setting and one column per family:
    the mean term ``|mu_X - mu_Y|^2`` (black; FD_avg's differs by a constant), the model's
    tr C_Y (shared) split into its parts within (green) and between (purple) its
    classes, and -2 tr(C_X^1/2 C_Y C_X^1/2)^1/2 against the pool (blue) and averaged
    over the clients (orange, dashed). FD_all's change is black + green + purple +
    blue, FD_avg's black + green + purple + orange: only the root term tells them
    apart, and a knob that scaled C_Y would move green and purple together."""
    from matplotlib.lines import Line2D

    fd = fd.assign(within=fd["trace_model"] - fd[SPLIT], root=-2 * fd["root"])
    lines = {
        ("all", "mean"): {"color": "black", "ls": "-", "label": r"$|\mu_X-\mu_Y|^2$"},
        ("all", "within"): {"color": "tab:green", "ls": "-", "label": r"tr $C_Y$ within classes"},
        ("all", SPLIT): {"color": "tab:purple", "ls": "-", "label": r"tr $C_Y$ between classes"},
        ("all", "root"): {"color": "tab:blue", "ls": "-", "label": r"$-2$ root, all"},
        ("avg", "root"): {"color": "tab:orange", "ls": "--", "label": r"$-2$ root, avg"},
    }
    with paper_style():
        fig, axes, settings, families = _grid(fd, 1.3)
        for r, setting in enumerate(settings):
            for c, family in enumerate(families):
                ax = axes[r, c]
                mine = fd[(fd["setting"] == setting) & (fd["family"] == family)]
                for (agg, term), style in lines.items():
                    curve = mine[mine["aggregation"] == agg].groupby("value")[term].mean()
                    change = curve - curve.iloc[0]
                    ax.plot(change.index, change, color=style["color"], ls=style["ls"], lw=1.0)
                ax.axhline(0, color="0.8", lw=0.5, zorder=0)
                _knob_axis(ax, mine, r == len(settings) - 1)
                if r == 0:
                    ax.set_title(family, loc="left")
                if c == 0:
                    ax.set_ylabel(f"change of each term\n{_setting_label(setting, extractor)}")
        handles = [
            Line2D([], [], color=s["color"], ls=s["ls"], label=s["label"]) for s in lines.values()
        ]
        fig.legend(handles=handles, loc="outside lower center", ncols=5)
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
