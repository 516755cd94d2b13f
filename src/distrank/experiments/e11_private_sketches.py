r"""E11 (beyond the paper): one private kernel mean sketch per site ranks the whole zoo.

KD is :math:`\|\mu_P - \mu_G\|^2`; with D random Fourier features each site publishes its
mean sketch :math:`s_i` once and the server scores every model from the pooled
:math:`s = \sum_i \lambda_i s_i` (:mod:`distrank.metrics.sketch`). On E9's zoo, partition
and clients (E9's subsample of ``client_size`` rows of each), E11 measures

- without noise, for each D of ``dims``: the largest relative error of sketch KD against
  the exact Gaussian-kernel KD_all (U statistic; bandwidth by the median heuristic on
  model ``bandwidth_from``, never on the clients' rows) and Kendall tau between them;
- at each epsilon, against the exact ranking: (a) ``scores``, E9's per-score release
  (each site releases its KD of every model, its budget split over the M models;
  :func:`~distrank.experiments.e9_private_ranking.e9_table`, E9's very draws);
  (b) ``sketch``, one Gaussian release of each :math:`s_i` (L2 sensitivity
  :math:`2/n_i`), then pooled; (c) ``secure_sketch``, a secure sum of :math:`n_i s_i`
  with distributed noise, threshold a majority of the sites; (d) ``fd_moments``, FD_all
  from each site's Gaussian release of its sums :math:`(\sum x, \sum x x^\top)` of rows
  clipped to L2 norm C (replace-one sensitivity of the pair at most
  :math:`\sqrt{(2C)^2 + (2C^2)^2} = 2\sqrt{C^2 + C^4}`), the covariance projected to PSD,
  against FD_all of the unclipped rows. Each: P(whole ranking kept) with its
  Clopper-Pearson 95 % interval, P(best model kept), mean Kendall tau;
- the bytes one site sends and receives under each protocol (``bytes_per_site``).

**Flips.** In both sketch protocols the pooled noise is :math:`\eta \sim \mathcal N(0,
\sigma^2 I_D)` (a sum of independent isotropic Gaussians). Model G's score
:math:`\frac{n\|s\|^2 - 1}{n - 1} + \frac{m\|t_G\|^2 - 1}{m - 1} - 2 s\cdot t_G` then moves
by :math:`-2\eta\cdot t_G` plus terms that are the same for every model. For models a
before b in the KD_all order, noiseless sketch gap :math:`g = \widehat{\mathrm{KD}}_b -
\widehat{\mathrm{KD}}_a` and :math:`v = t_b - t_a`, the noisy gap is :math:`g - 2\eta\cdot
v \sim \mathcal N(g, 4\sigma^2\|v\|^2)`, so exactly

.. math::
    P(\text{a and b swap}) = \Phi\big(-g / (2\sigma\|v\|)\big)

(:func:`~distrank.experiments.sketch_forms.flip_probability`; g < 0 when the sketch itself swaps them).

**Calibration.** The gap's noise std :math:`2\sigma\|v\|` is known to the server (σ from
the sites' budgets, v from the models' sketches), so each gap comes with an interval
:math:`\tilde g \pm z_c\, 2\sigma\|v\|`, :math:`z_c = \Phi^{-1}((1 + c)/2)`, of nominal
level c, and a pair is *resolved at level c* when :math:`|\tilde g| > z_c\, 2\sigma\|v\|`
(then it is ordered against the noiseless sketch with probability at most (1 - c)/2).
:func:`~distrank.experiments.sketch_forms.calibration` measures, per adjacent pair, protocol, epsilon and level of
``LEVELS``, the interval's coverage of the noiseless gap over the draws, its binomial
standard error at the nominal level, and how often the pair is resolved, and resolved the
wrong way (the ``_calibration`` table).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from distrank._io import atomic_open
from distrank.experiments import Job, Outputs, check_model, check_partition
from distrank.experiments.e9_private_ranking import e9_table, kernel_inputs, nested_subsamples
from distrank.experiments.sketch_forms import (  # noqa: F401 -- E11's closed forms, re-exported
    LEVELS,
    bytes_per_site,
    calibration,
    clip_rows,
    fd_from_moments,
    flip_probability,
    moment_sensitivity,
    threshold,
)
from distrank.figures import new_figure, paper_style
from distrank.metrics._ranking import tau_b

__all__ = ["check", "run", "sketch_scores", "agreement", "flip_probability", "bytes_per_site"]
__all__ += ["clip_rows", "moment_sensitivity", "fd_from_moments", "e11_table", "e11_figure"]
__all__ += ["calibration", "LEVELS"]

TABLES = ("", "_flips", "_calibration")
#: protocol -> how the figure names it
PROTOCOLS = {
    "scores": "per-score release (E9)",
    "sketch": "one sketch per site",
    "secure_sketch": "secure sum of sketches",
    "fd_moments": "FD from noised moments",
}
COLUMNS = ["group", "protocol", "dim", "epsilon", "delta", "n_draws", "noise_std", "rel_error"]
COLUMNS += ["p_same_ranking", "p_low", "p_high", "p_same_best", "mean_kendall_tau"]
COLUMNS += ["std_kendall_tau", "bytes_up", "bytes_down", "bandwidth", "clip_norm"]
FLIP_COLUMNS = ["protocol", "epsilon", "rank", "pair", "kd_gap", "sketch_gap", "diff_norm"]
FLIP_COLUMNS += ["noise_std", "p_flip_predicted", "p_flip_measured", "n_draws"]
#: nominal levels of the calibration table
CALIBRATION_COLUMNS = ["protocol", "epsilon", "rank", "pair", "level", "z", "sketch_gap"]
CALIBRATION_COLUMNS += ["gap_std", "coverage", "coverage_se", "coverage_z", "p_resolved"]
CALIBRATION_COLUMNS += ["p_resolved_wrong", "n_draws"]


def check(settings: Mapping, config: Mapping) -> None:
    check_partition(config, "experiments.E11.partition", settings["partition"])
    check_model(config, "experiments.E11.bandwidth_from", settings["bandwidth_from"])
    if config["metrics"]["kd_estimator"] != "unbiased":
        raise ValueError(
            "config: experiments.E11 needs metrics.kd_estimator 'unbiased' "
            "(sketch KD is the U statistic)"
        )
    if sorted(set(settings["dims"])) != list(settings["dims"]):
        raise ValueError(f"config: experiments.E11.dims must increase, got {settings['dims']}")


def sketch_scores(pooled, n: int, models, model_sizes) -> np.ndarray:
    """Sketch KD (:func:`distrank.metrics.sketch.sketch_kd`) of each model, (..., M), from
    pooled mean sketches ``pooled`` (..., D) of n rows and ``models`` (M, D) of m_G rows."""
    s, t = np.asarray(pooled, np.float64), np.asarray(models, np.float64)
    m = np.asarray(model_sizes, np.float64)
    own = (n * np.einsum("...d,...d->...", s, s) - 1.0) / (n - 1)
    return own[..., None] + (m * np.einsum("gd,gd->g", t, t) - 1.0) / (m - 1) - 2.0 * s @ t.T


def agreement(scores, truth) -> dict:
    """How the rankings of the draws (rows of ``scores``, lower is better) agree with
    ``truth``'s: P(same order) with its Clopper-Pearson 95 % interval, P(same best),
    Kendall tau-b (mean, std)."""
    from scipy import stats

    scores, truth = np.atleast_2d(scores), np.asarray(truth, np.float64)
    same = np.all(np.argsort(scores, axis=1) == np.argsort(truth), axis=1)
    tau = tau_b(scores, np.broadcast_to(truth, scores.shape))
    ci = stats.binomtest(int(same.sum()), len(same)).proportion_ci(0.95, method="exact")
    best = float(np.mean(np.argmin(scores, axis=1) == np.argmin(truth)))
    out = {"n_draws": len(same), "p_same_ranking": float(same.mean()), "p_low": ci.low}
    out |= {"p_high": ci.high, "p_same_best": best, "mean_kendall_tau": float(tau.mean())}
    return out | {"std_kendall_tau": float(tau.std())}


# -- the pre-steps: what is heavy, once ------------------------------------------------------


def _load(job: Job):
    from distrank.clients import load_manifest
    from distrank.features.cache import load_features

    models = dict(zip(job.params["models"], map(load_features, job.inputs["models"])))
    settings, seed = job.params["settings"], job.params["seed"]
    owner = load_manifest(job.inputs["manifest"])
    tier = nested_subsamples(owner, sizes=[settings["client_size"]], seed=seed)
    return load_features(job.inputs["reference"]), owner, tier, models, settings, seed


def sketches_centralized(job: Job) -> None:
    """Pre-step ``e11_sketches_centralized``: the exact client and pooled KD of every model
    (E9's ``kernel_inputs`` at ``client_size``), and every client's and model's mean
    sketch at the largest D (the others are nested: ``truncate``)."""
    from distrank.metrics._kernels import median_bandwidth
    from distrank.metrics.sketch._maps import FeatureMap
    from distrank.zoo import torch_session

    reference, owner, tier, models, settings, seed = _load(job)
    size, metrics = settings["client_size"], job.params["metrics"]
    bandwidth = median_bandwidth(models[settings["bandwidth_from"]], kernel="rbf", seed=seed)
    with torch_session(seed, job.threads):
        options = {"estimator": metrics["kd_estimator"], "dtype": metrics["dtype"]}
        options |= {"kernel": "rbf", "bandwidth": bandwidth, "device": job.params["device"]}
        kd = kernel_inputs(reference, owner, models, sizes=[size], seed=seed, **options)[size]
    fmap = FeatureMap(np.shape(reference)[1], max(settings["dims"]), bandwidth, seed)
    rows, owners = np.asarray(reference)[tier == 0], owner[tier == 0]
    with atomic_open(job.outputs["sketches"]) as f:
        np.savez(
            f,
            models=np.array(list(models)),
            bandwidth=bandwidth,
            seed=seed,
            input_dim=fmap.input_dim,
            model_sizes=[len(y) for y in models.values()],
            client_sketches=[fmap.sketch(rows[owners == c]).mean for c in np.unique(owners)],
            model_sketches=[fmap.sketch(y).mean for y in models.values()],
            **kd,
        )


def fd_private(job: Job) -> None:
    """Pre-step ``e11_fd_private``: FD_all of the clients' rows, and FD from their clipped
    moments without noise and with every site's noise (the k sites' Gaussians drawn as one
    of k times the variance; the outer products' noise symmetric, as a release of their
    upper triangle with off-diagonals times sqrt 2 gives), ``fd.n_draws`` per epsilon."""
    from distrank.metrics._privacy import noise_multiplier
    from distrank.metrics.fd._frechet import frechet_distances, gaussian_stats
    from distrank.zoo import torch_session

    reference, owner, tier, models, settings, seed = _load(job)
    fd, rows = settings["fd"], np.asarray(reference, np.float64)[tier == 0]
    k, n, d = len(np.unique(owner[tier == 0])), len(rows), rows.shape[1]
    clipped = clip_rows(rows, fd["clip_norm"])
    s1, s2 = clipped.sum(axis=0), clipped.T @ clipped
    stds = [
        noise_multiplier(epsilon=e, delta=settings["delta"])
        * moment_sensitivity(fd["clip_norm"])
        * math.sqrt(k)
        for e in fd["epsilons"]
    ]
    draws = np.empty((len(stds), fd["n_draws"], len(models)))
    with torch_session(seed, job.threads):
        stats = [gaussian_stats(y) for y in models.values()]
        fd_all = frechet_distances([gaussian_stats(rows)], stats)[0]
        fd_clipped = fd_from_moments(s1, s2, n, stats)
        for i, std in enumerate(stds):
            rng = np.random.default_rng([seed, 11, 4, i])
            for j in range(fd["n_draws"]):
                noise = rng.standard_normal((d + 1, d)) * std
                noisy_s2 = s2 + (noise[:d] + noise[:d].T) / 2
                draws[i, j] = fd_from_moments(s1 + noise[d], noisy_s2, n, stats)
    with atomic_open(job.outputs["fd"]) as f:
        np.savez(f, fd_all=fd_all, fd_clipped=fd_clipped, noise_std=stds, fd_noisy=draws)


STEPS = {"e11_sketches_centralized": sketches_centralized, "e11_fd_private": fd_private}


# -- the light rule: noise, rankings, bytes ---------------------------------------------------


def _sketches(inputs: Mapping, dim: int):
    """The clients' sketches and the models' mean sketches (M, dim) at ``dim``."""
    from distrank.metrics.sketch._maps import FeatureMap, Sketch, truncate

    full, h = inputs["client_sketches"].shape[1], float(inputs["bandwidth"])
    meta = FeatureMap(int(inputs["input_dim"]), full, h, int(inputs["seed"])).meta()
    clients = zip(inputs["client_sketches"], inputs["client_sizes"])
    models = zip(inputs["model_sketches"], inputs["model_sizes"])
    return [truncate(Sketch(s, int(n), meta), dim) for s, n in clients], np.array(
        [truncate(Sketch(t, int(m), meta), dim).mean for t, m in models]
    )


def exact_rows(inputs: Mapping, dims: Sequence[int]) -> list[dict]:
    """Without noise, per D: the largest ``|sketch KD - KD_all| / KD_all`` over the models,
    whether the ranking is KD_all's, and Kendall tau (``inputs``: the pre-step's arrays)."""
    from distrank.metrics.sketch._maps import pool

    rows, kd_all = [], np.asarray(inputs["kd_all"])
    for dim in dims:
        clients, models = _sketches(inputs, dim)
        pooled = pool(clients)
        kd = sketch_scores(pooled.mean, pooled.n, models, inputs["model_sizes"])
        same = float(np.array_equal(np.argsort(kd), np.argsort(kd_all)))
        error = float(np.max(np.abs(kd - kd_all) / np.abs(kd_all)))
        tau = float(tau_b(kd, kd_all))
        rows.append(dict(group="no noise", protocol="sketch", dim=dim, noise_std=0.0))
        rows[-1] |= dict(rel_error=error, p_same_ranking=same, mean_kendall_tau=tau)
    return rows


def _noisy_pool(protocol: str, clients, *, epsilon, delta, n_draws, rng):
    """(n_draws, D) pooled sketches under ``protocol``, and their noise std."""
    from distrank.metrics.sketch._maps import Sketch, pool, release_sketch, sketch_sum_std

    if protocol == "sketch":  # each site's own release, then pooled
        batch = [
            Sketch(np.broadcast_to(s.mean, (n_draws, s.mean.size)), s.n, s.meta) for s in clients
        ]
        noisy = pool([release_sketch(s, epsilon=epsilon, delta=delta, rng=rng) for s in batch])
        return noisy.mean, noisy.noise_std
    exact, k = pool(clients), len(clients)
    std = sketch_sum_std(exact.n, epsilon=epsilon, delta=delta, threshold=threshold(k), n_sites=k)
    return exact.mean + rng.normal(0.0, std, (n_draws, exact.mean.size)), std


def private_rows(
    inputs: Mapping, *, epsilons: Sequence[float], delta: float, n_draws: int, seed: int
) -> tuple[list[dict], pd.DataFrame, pd.DataFrame]:
    """The two sketch protocols at the largest D, per epsilon: the draws' agreement with
    KD_all, each adjacent pair's flip rate beside ``flip_probability`` (noise from
    ``default_rng([seed, 11, p, i])``, p = 1 local, 2 secure, i the epsilon's index), and
    each adjacent pair's ``calibration`` on the same draws."""
    from distrank.metrics.sketch._maps import pool

    clients, models = _sketches(inputs, inputs["client_sketches"].shape[1])
    names, kd_all, m = inputs["models"], np.asarray(inputs["kd_all"]), inputs["model_sizes"]
    n, order = sum(s.n for s in clients), np.argsort(kd_all)
    base = sketch_scores(pool(clients).mean, n, models, m)
    rows, flips, calibrated = [], [], []
    pairs = list(zip(order[:-1], order[1:]))
    names_of = [f"{names[a]} < {names[b]}" for a, b in pairs]
    diff_norms = np.array([np.linalg.norm(models[b] - models[a]) for a, b in pairs])
    for p, protocol in enumerate(("sketch", "secure_sketch"), start=1):
        for i, epsilon in enumerate(epsilons):
            rng = np.random.default_rng([seed, 11, p, i])
            noisy, std = _noisy_pool(
                protocol, clients, epsilon=epsilon, delta=delta, n_draws=n_draws, rng=rng
            )
            scores = sketch_scores(noisy, n, models, m)
            rows.append(
                {"group": "private KD", "protocol": protocol, "dim": models.shape[1]}
                | {"epsilon": epsilon, "delta": delta, "noise_std": std}
                | agreement(scores, kd_all)
            )
            for r, (a, b) in enumerate(zip(order[:-1], order[1:]), start=1):
                v, gap = float(np.linalg.norm(models[b] - models[a])), base[b] - base[a]
                flips.append(
                    (protocol, epsilon, r, f"{names[a]} < {names[b]}", kd_all[b] - kd_all[a])
                    + (gap, v, std, float(flip_probability(gap, v, std)))
                    + (float(np.mean(scores[:, a] > scores[:, b])), n_draws)
                )
            calibrated.append(
                _calibration_rows(
                    protocol, epsilon, pairs, names_of, scores, base, 2 * std * diff_norms
                )
            )
    calibrated = pd.concat(calibrated, ignore_index=True)[CALIBRATION_COLUMNS]
    return rows, pd.DataFrame(flips, columns=FLIP_COLUMNS), calibrated


def _calibration_rows(protocol, epsilon, pairs, names, scores, base, gap_std) -> pd.DataFrame:
    """``calibration`` of the adjacent pairs' gaps (b's score minus a's), a row per
    pair and level."""
    a, b = (np.array(side) for side in zip(*pairs))
    got = calibration(scores[:, b] - scores[:, a], base[b] - base[a], gap_std)
    n_levels = len(got["level"])
    out = pd.DataFrame({k: v.ravel() for k, v in got.items()})
    out["protocol"], out["epsilon"], out["n_draws"] = protocol, epsilon, len(scores)
    out["rank"] = np.tile(np.arange(1, len(pairs) + 1), n_levels)
    out["pair"] = np.tile(names, n_levels)
    out["sketch_gap"] = np.tile(base[b] - base[a], n_levels)
    out["gap_std"] = np.tile(gap_std, n_levels)
    return out.sort_values(["rank", "level"], kind="stable")


def score_rows(inputs: Mapping, *, weights: str, **e9_kw) -> list[dict]:
    """E9's per-score release of the same client KD (``e9_table``, E9's draws); its
    noise_std becomes that of KD_avg, sqrt(sum_i lambda_i^2 sigma_i^2), sigma_i ~ 1 / n_i."""
    from distrank.clients import client_weights

    sizes = np.asarray(inputs["client_sizes"])
    kd = {int(sizes.min()): {k: inputs[k] for k in ("kd_client", "kd_all", "client_sizes")}}
    table = e9_table(kd, weights=weights, **e9_kw)
    lam = client_weights(sizes, weights)
    table["noise_std"] *= math.sqrt(np.sum((lam * sizes.min() / sizes) ** 2))
    keep = ["epsilon", "delta", "n_draws", "noise_std", "p_same_ranking", "p_low", "p_high"]
    keep += ["p_same_best", "mean_kendall_tau", "std_kendall_tau"]
    return [
        {"group": "private KD", "protocol": "scores"} | r for r in table[keep].to_dict("records")
    ]


def fd_rows(fd: Mapping, settings: Mapping, delta: float) -> list[dict]:
    """FD's group against FD_all: the clipped moments without noise, then noised at each
    epsilon of ``settings`` (E11's ``fd`` section)."""
    head = {"group": "FD", "protocol": "fd_moments", "clip_norm": settings["clip_norm"]}
    fd_all, clipped = np.asarray(fd["fd_all"]), np.asarray(fd["fd_clipped"])
    exact = agreement(clipped, fd_all)
    rows = [
        head
        | {"noise_std": 0.0, "rel_error": float(np.max(np.abs(clipped - fd_all) / fd_all))}
        | {k: exact[k] for k in ("p_same_ranking", "p_same_best", "mean_kendall_tau")}
    ]
    for epsilon, std, draws in zip(settings["epsilons"], fd["noise_std"], fd["fd_noisy"]):
        rows.append(
            head | {"epsilon": epsilon, "delta": delta, "noise_std": std} | agreement(draws, fd_all)
        )
    return rows


def e11_table(inputs: Mapping, fd: Mapping, settings: Mapping, context: Mapping):
    """The table (no-noise D, then each protocol per epsilon, then FD's group, with each
    protocol's bytes per site), the flips table and the calibration table, from the
    pre-steps' arrays; ``context`` gives the seed and the study's KD estimator and weights."""
    common = {"epsilons": settings["epsilons"], "delta": settings["delta"]}
    common |= {"n_draws": settings["n_draws"], "seed": context["seed"]}
    private, flips, calibrated = private_rows(inputs, **common)
    metrics = context["metrics"]
    rows = exact_rows(inputs, settings["dims"]) + score_rows(
        inputs, estimator=metrics["kd_estimator"], weights=metrics["weights"], **common
    )
    rows += private
    table = pd.DataFrame(rows + fd_rows(fd, settings["fd"], settings["delta"]), columns=COLUMNS)
    sizes = {"n_features": int(inputs["input_dim"]), "model_sizes": inputs["model_sizes"]}
    table[["bytes_up", "bytes_down"]] = [
        bytes_per_site(p, dim=0 if np.isnan(dim) else int(dim), **sizes)
        for p, dim in zip(table.protocol, table.dim)
    ]
    table.loc[table.group != "FD", "bandwidth"] = float(inputs["bandwidth"])
    return table, flips, calibrated


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    arrays = {}
    for name in ("sketches", "fd"):
        with np.load(inputs[name], allow_pickle=False) as f:
            arrays[name] = dict(f)
    table, flips, calibrated = e11_table(arrays["sketches"], arrays["fd"], settings, context)
    tables = {"": table, "_flips": flips, "_calibration": calibrated}
    return Outputs(tables, {"": e11_figure(table, flips)})


def _against_epsilon(a, b, table: pd.DataFrame) -> None:
    """Panels (a) and (b): P(whole ranking kept) with its 95 % interval and mean tau."""
    private = table[table.epsilon.notna()]
    for j, (protocol, label) in enumerate(PROTOCOLS.items()):
        rows = private[private.protocol == protocol].sort_values("epsilon")
        if protocol == "fd_moments":  # a few draws: bars, not a band
            err = [rows.p_same_ranking - rows.p_low, rows.p_high - rows.p_same_ranking]
            label = f"{label} ({int(rows.n_draws.max())} draws a point)"
            style = {"fmt": "s--", "color": f"C{j}", "ms": 3, "capsize": 2, "label": label}
            a.errorbar(rows.epsilon, rows.p_same_ranking, err, **style)
        else:
            a.plot(rows.epsilon, rows.p_same_ranking, "o-", color=f"C{j}", ms=3, label=label)
            a.fill_between(rows.epsilon, rows.p_low, rows.p_high, color=f"C{j}", alpha=0.2, lw=0)
        b.plot(rows.epsilon, rows.mean_kendall_tau, "s--" if j == 3 else "o-", color=f"C{j}", ms=3)
    epsilons = sorted(private.epsilon.unique())
    for ax, ylabel in ((a, "P(whole ranking kept)"), (b, r"mean Kendall $\tau$ with exact")):
        ax.set_xscale("log")
        ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        ax.minorticks_off()
        ax.set_xlabel(rf"each site's budget $\varepsilon$ ($\delta$ = {private.delta.iloc[0]:g})")
        ax.set_ylabel(ylabel)
    a.set_ylim(-0.03, 1.03)
    a.set_title("(a) Whole ranking of exact KD$_\\mathrm{all}$ (FD$_\\mathrm{all}$)", loc="left")
    b.set_title("(b) Rank correlation", loc="left")


def e11_figure(table: pd.DataFrame, flips: pd.DataFrame):
    """A matplotlib Figure: (a) P(whole ranking kept) and (b) mean Kendall tau against
    epsilon, a line per protocol; (c) bytes one site sends and receives; (d) predicted
    against measured flip rates of adjacent pairs."""
    with paper_style():
        fig, ((a, b), (c, d)) = new_figure(2, 2, width="double", height=5.8)
        _against_epsilon(a, b, table)
        first = table[table.epsilon.notna()].drop_duplicates("protocol").set_index("protocol")
        first, y = first.loc[list(PROTOCOLS)], np.arange(len(PROTOCOLS))
        for shift, column, colour in ((-0.2, "bytes_up", "0.25"), (0.2, "bytes_down", "0.65")):
            c.barh(y + shift, first[column].replace(0, np.nan), 0.38, color=colour)
            for yi, value in zip(y + shift, first[column]):
                if value:  # nothing received: no bar, no label
                    c.text(value * 1.4, yi, _size(value), va="center", fontsize="small")
        c.set_yticks(y, list(PROTOCOLS.values()))
        c.set(xscale="log", xlim=(1, 3e9), xlabel="bytes per site: sent (dark), received (light)")
        c.invert_yaxis()
        c.set_title("(c) Communication of one release", loc="left")
        for j, protocol in ((1, "sketch"), (2, "secure_sketch")):
            rows = flips[flips.protocol == protocol]
            d.plot(rows.p_flip_predicted, rows.p_flip_measured, ".", color=f"C{j}", ms=4)
        d.plot([0, 0.5], [0, 0.5], color="0.6", lw=0.8, ls="--", zorder=0)
        d.set_xlabel(r"predicted $\Phi(-g\,/\,(2\sigma\|v\|))$")
        d.set_ylabel(f"measured flip rate ({int(flips.n_draws.max())} draws)")
        d.set_title("(d) Adjacent pairs of the KD$_\\mathrm{all}$ order, sketches", loc="left")
        fig.legend(*a.get_legend_handles_labels(), loc="outside lower center", ncols=2)
    return fig


def _size(n_bytes: float) -> str:
    unit = min(int(math.log(n_bytes, 1000)), 3)
    return f"{n_bytes / 1000**unit:.3g} {['B', 'kB', 'MB', 'GB'][unit]}"
