r"""E9: how often private clients still rank the zoo as centralized KD does.

Every client releases its KD of each model through the Gaussian mechanism
(``distrank.metrics._privacy``: bounded kernel, sensitivity :math:`4/n_i` for the U
form, the client's :math:`(\varepsilon, \delta)` split over the M models it scores);
the server ranks the models by the average of the noisy values. Without noise that
ranking is exactly the KD_all ranking (Theorem 1), so every disagreement is the
price of privacy. For each client size (nested random subsamples of each client
of the partition, the same size for every client) and each epsilon, over
``n_draws`` noise draws: the probability that the private KD_avg ranking equals
the non-private KD_all ranking (with its Clopper-Pearson interval) and the mean
Kendall tau-b between them.

The centralized pre-step (``kernel_inputs``) computes, once, the exact client
and pooled KD of every model at every size; ``e9_table`` adds the noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from distrank._io import atomic_open
from distrank.experiments import Job, Outputs
from distrank.figures import new_figure, paper_style
from distrank.metrics._metric import FULL_SAMPLE_ESTIMATORS

if TYPE_CHECKING:  # matplotlib, torch, scipy and dp-accounting load in the jobs, not at DAG time
    from matplotlib.figure import Figure

    from distrank.metrics.kd._sums import KernelSums

__all__ = [
    "check",
    "run",
    "nested_subsamples",
    "kernel_inputs",
    "write_kernel_inputs",
    "read_kernel_inputs",
    "e9_table",
    "half_epsilon",
    "e9_figure",
]

COLUMNS = [
    "client_size",
    "epsilon",
    "delta",
    "n_clients",
    "n_models",
    "n_draws",
    "sensitivity",
    "noise_std",
    "epsilon_spent",
    "p_same_ranking",
    "p_low",
    "p_high",
    "p_same_best",
    "mean_kendall_tau",
    "std_kendall_tau",
]


def check(settings: Mapping, config: Mapping) -> None:
    if settings["bandwidth_from"] not in config["models"]:
        raise ValueError(
            f"config: experiments.E9.bandwidth_from {settings['bandwidth_from']!r} "
            f"is not a model of `models`"
        )
    if config["metrics"]["kd_estimator"] not in FULL_SAMPLE_ESTIMATORS:
        raise ValueError(
            "config: experiments.E9 needs metrics.kd_estimator 'unbiased' or "
            "'biased' (private KD is a full-sample estimate)"
        )
    sizes = settings["client_sizes"]
    if sorted(set(sizes)) != list(sizes):
        raise ValueError(f"config: experiments.E9.client_sizes must increase, got {sizes}")


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    from distrank.metrics._options import score_options

    options = score_options(context["metrics"])  # the study's scoring options
    kd_inputs = read_kernel_inputs(inputs["kernel_inputs"])
    table = e9_table(
        kd_inputs,
        epsilons=settings["epsilons"],
        delta=settings["delta"],
        n_draws=settings["n_draws"],
        estimator=options.kd_estimator,
        weights=options.weights,
        seed=context["seed"],
    )
    return Outputs({"": table}, {"": e9_figure(table)})


def nested_subsamples(owner: np.ndarray, *, sizes: Sequence[int], seed: int) -> np.ndarray:
    """Tier of each reference row: t when it is in the size-``sizes[t]`` subsample of
    its client but not the smaller ones, -1 when in none (or unassigned, owner < 0).

    Each client's rows are shuffled once (``numpy.random.default_rng(seed)``) and the
    first ``sizes[t]`` taken, so the subsamples of one client are nested.
    """
    owner = np.asarray(owner)
    rng = np.random.default_rng(seed)
    tier = np.full(owner.shape, -1, dtype=np.int64)
    for c in np.unique(owner[owner >= 0]):
        rows = rng.permutation(np.flatnonzero(owner == c))
        if len(rows) < sizes[-1]:
            raise ValueError(
                f"client_sizes: client {c} has {len(rows)} rows, fewer than {sizes[-1]}"
            )
        for t in range(len(sizes) - 1, -1, -1):
            tier[rows[: sizes[t]]] = t
    return tier


def kernel_inputs(
    reference,
    owner,
    models: Mapping[str, np.ndarray],
    *,
    sizes: Sequence[int],
    kernel: str,
    bandwidth: float,
    estimator: str,
    seed: int,
    dtype: str = "float64",
    device=None,
) -> dict[int, dict[str, np.ndarray]]:
    """Exact KD per (model, client) and KD_all per model, for each client size.

    One ``kernel_sums`` pass over the largest subsamples, with a group per (client,
    tier); the sums of a size are those of its tiers merged (``_merge``), so every
    size gets the KD that ``kernel_sums`` would give on its rows alone. Returns size
    -> ``{"kd_client": (M, k), "kd_all": (M,), "client_sizes": (k,)}``.
    """
    from distrank.metrics._kernels import make_kernel
    from distrank.metrics.kd._privacy import BOUNDED_KERNELS
    from distrank.metrics.kd._sums import kernel_sums

    if kernel not in BOUNDED_KERNELS:
        raise ValueError(f"kernel: E9 needs a bounded kernel {BOUNDED_KERNELS}, got {kernel!r}")
    owner = np.asarray(owner)
    tier = nested_subsamples(owner, sizes=sizes, seed=seed)
    used = tier >= 0
    clients = np.unique(owner[used])
    n_tiers = len(sizes)
    group = np.searchsorted(clients, owner[used]) * n_tiers + tier[used]
    kern = make_kernel(kernel, {"bandwidth": bandwidth}, np.asarray(reference).shape[1])
    sums = kernel_sums(
        np.asarray(reference)[used], group, list(models.values()), kern, dtype=dtype, device=device
    )
    out = {}
    for t, size in enumerate(sizes):
        merged = _merge(
            sums, [[c * n_tiers + u for u in range(t + 1)] for c in range(len(clients))]
        )
        kd_client, kd_all = merged.kd(estimator)
        out[int(size)] = {
            "kd_client": kd_client,
            "kd_all": kd_all,
            "client_sizes": merged.client_sizes,
        }
    return out


def _merge(sums: KernelSums, groups: Sequence[Sequence[int]]) -> KernelSums:
    """The kernel sums of clients that are unions of the given groups of ``sums``."""
    from distrank.metrics.kd._sums import KernelSums

    xy = np.stack([sums.xy[:, g].sum(axis=1) for g in groups], axis=1)
    xx = np.array([[sums.xx[np.ix_(a, b)].sum() for b in groups] for a in groups])
    return KernelSums(
        client_sizes=np.array([sums.client_sizes[g].sum() for g in groups]),
        model_sizes=sums.model_sizes,
        xx=xx,
        xx_diag=np.array([sums.xx_diag[g].sum() for g in groups]),
        xy=xy,
        yy=sums.yy,
        yy_diag=sums.yy_diag,
    )


def write_kernel_inputs(
    reference_path,
    manifest_path,
    model_paths: Mapping,
    out_path,
    *,
    kernel: str,
    bandwidth_from: str,
    seed: int,
    threads: int = 1,
    **options,
) -> None:
    """The centralized pre-step: ``kernel_inputs`` of the files, to one npz.

    The bandwidth is the median heuristic on the features of model
    ``bandwidth_from`` (e.g. held-out real images), never on the clients' rows;
    torch uses at most ``threads`` threads. ``options`` are ``kernel_inputs``'
    (``sizes``, ``estimator``, ``dtype``, ``device``).
    """
    from distrank.clients import load_manifest
    from distrank.features.cache import load_features
    from distrank.metrics._kernels import median_bandwidth
    from distrank.zoo import torch_session

    models = {name: load_features(path) for name, path in model_paths.items()}
    bandwidth = median_bandwidth(models[bandwidth_from], kernel=kernel, seed=seed)
    with torch_session(seed, threads):
        result = kernel_inputs(
            load_features(reference_path),
            load_manifest(manifest_path),
            models,
            kernel=kernel,
            bandwidth=bandwidth,
            seed=seed,
            **options,
        )
    arrays = {
        f"{size}/{key}": value for size, by_key in result.items() for key, value in by_key.items()
    }
    with atomic_open(out_path) as f:
        np.savez(f, models=np.array(list(models)), bandwidth=bandwidth, **arrays)


def kernel_inputs_centralized(job: Job) -> None:
    """Pre-step ``e9_kernel_inputs_centralized``: :func:`write_kernel_inputs` on the
    rule's files."""
    settings, metrics = job.params["settings"], job.params["metrics"]
    write_kernel_inputs(
        job.inputs["reference"],
        job.inputs["manifest"],
        dict(zip(job.params["models"], job.inputs["models"])),
        job.outputs["kernel_inputs"],
        sizes=settings["client_sizes"],
        kernel=settings["kernel"],
        bandwidth_from=settings["bandwidth_from"],
        estimator=metrics["kd_estimator"],
        dtype=metrics["dtype"],
        **job.args("seed", "device", "threads"),
    )


STEPS = {"e9_kernel_inputs_centralized": kernel_inputs_centralized}


def read_kernel_inputs(path) -> dict[int, dict[str, np.ndarray]]:
    """What :func:`write_kernel_inputs` wrote: size -> arrays (and ``"models"``)."""
    with np.load(path, allow_pickle=False) as f:
        out: dict = {}
        for key in f.files:
            if "/" in key:
                size, name = key.split("/")
                out.setdefault(int(size), {})[name] = f[key]
        for by_key in out.values():
            by_key["models"] = f["models"]
    return dict(sorted(out.items()))


def e9_table(
    kd_inputs: Mapping[int, Mapping[str, np.ndarray]],
    *,
    epsilons: Sequence[float],
    delta: float,
    n_draws: int,
    estimator: str = "unbiased",
    weights: str = "size",
    seed: int = 0,
) -> pd.DataFrame:
    """One row per (client size, epsilon): agreement of private KD_avg with KD_all.

    ``kd_inputs`` maps a client size to ``kd_client`` (M, k), ``kd_all`` (M,) and
    ``client_sizes`` (k,) (``kernel_inputs``). Each of ``n_draws`` draws adds
    every client's noise (:func:`distrank.metrics.kd.release_kd`, noise from
    ``numpy.random.default_rng([seed, size, i])`` for the i-th epsilon), averages
    with the ``weights`` lambda_i, and compares the ranking with KD_all's:
    ``p_same_ranking`` (identical order of all M models; Clopper-Pearson 95 %
    ``p_low``/``p_high``), ``p_same_best`` (the same best model),
    ``mean_kendall_tau``/``std_kendall_tau`` (tau-b, ddof 0).
    ``sensitivity`` and ``noise_std`` are those of the smallest client.
    """
    from scipy import stats

    from distrank.clients import client_weights
    from distrank.metrics._privacy import client_budget
    from distrank.metrics._ranking import tau_b
    from distrank.metrics._registry import METRICS
    from distrank.metrics.kd._privacy import kd_sensitivity, release_kd

    counts = {len(arrays["kd_all"]) for arrays in kd_inputs.values()}
    if len(counts) != 1:
        raise ValueError(f"kd_inputs: the sizes score different numbers of models {counts}")
    n_models = counts.pop()
    budgets = [client_budget(epsilon=e, delta=delta, n_releases=n_models) for e in epsilons]
    rows = []
    for size, arrays in kd_inputs.items():
        kd_client, kd_all = np.asarray(arrays["kd_client"]), np.asarray(arrays["kd_all"])
        sizes = np.asarray(arrays["client_sizes"])
        lam = client_weights(sizes, weights)
        order = np.argsort(kd_all, kind="stable")
        sensitivity = kd_sensitivity(int(sizes.min()), estimator=estimator)
        for i, (epsilon, budget) in enumerate(zip(epsilons, budgets)):
            noisy = release_kd(
                np.broadcast_to(kd_client, (n_draws,) + kd_client.shape),
                sizes,
                budget=budget,
                estimator=estimator,
                rng=np.random.default_rng([seed, int(size), i]),
            )
            avg = METRICS["kd"].average(noisy, lam)  # (draws, M): KD's avg
            same = np.all(np.argsort(avg, axis=1, kind="stable") == order, axis=1)
            same_best = np.argmin(avg, axis=1) == order[0]
            tau = tau_b(avg, np.broadcast_to(kd_all, avg.shape))
            hits = int(same.sum())
            ci = stats.binomtest(hits, n_draws).proportion_ci(0.95, method="exact")
            rows.append(
                (
                    int(size),
                    float(epsilon),
                    float(delta),
                    len(sizes),
                    n_models,
                    n_draws,
                    sensitivity,
                    budget.noise_std(sensitivity),
                    budget.epsilon_spent,
                    hits / n_draws,
                    ci.low,
                    ci.high,
                    float(same_best.mean()),
                    float(tau.mean()),
                    float(tau.std()),
                )
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def half_epsilon(rows: pd.DataFrame) -> float:
    """The epsilon at which ``p_same_ranking`` of one client size first reaches 1/2,
    interpolated linearly in log epsilon between the grid points around it (NaN if it
    stays below 1/2 on the grid; the first epsilon if it starts above)."""
    rows = rows.sort_values("epsilon")
    eps, p = np.log(rows["epsilon"].to_numpy(float)), rows["p_same_ranking"].to_numpy(float)
    above = np.flatnonzero(p >= 0.5)
    if not above.size:
        return float("nan")
    i = above[0]
    if i == 0:
        return float(np.exp(eps[0]))
    return float(np.exp(np.interp(0.5, [p[i - 1], p[i]], [eps[i - 1], eps[i]])))


def e9_figure(table: pd.DataFrame) -> Figure:
    """Two panels against epsilon (log axis), one colour per client size: (a) P(private
    KD_avg ranking = KD_all ranking) with its 95 % Clopper-Pearson band (solid), and
    P(same best model) (dashed), the epsilon where the first reaches 1/2 marked
    (:func:`half_epsilon`, in the legend too); (b) the mean Kendall tau."""
    with paper_style():
        fig, axes = new_figure(1, 2, width="double", height=3.0)
        sizes = sorted(table.client_size.unique())
        colours = [f"C{i}" for i in range(len(sizes))]
        axes[0, 0].axhline(0.5, color="0.75", lw=0.6, ls=":", zorder=0)
        for size, colour in zip(sizes, colours):
            rows = table[table.client_size == size].sort_values("epsilon")
            half = half_epsilon(rows)
            if np.isnan(half):
                reach = rf"below 1/2 up to $\varepsilon$ = {rows.epsilon.max():g}"
            else:
                reach = (
                    rf"1/2 at $\varepsilon$ ≈ {half:.2g}"
                    if half < 10
                    else rf"1/2 at $\varepsilon$ ≈ {half:.0f}"
                )
                axes[0, 0].plot(half, 0.5, marker="|", ms=9, mew=1.5, color=colour)
            label = f"$n_i$ = {size} ({reach})"
            axes[0, 0].plot(rows.epsilon, rows.p_same_ranking, "o-", color=colour, label=label)
            axes[0, 0].fill_between(
                rows.epsilon, rows.p_low, rows.p_high, color=colour, alpha=0.15, lw=0
            )
            axes[0, 0].plot(rows.epsilon, rows.p_same_best, "s--", color=colour, ms=3, lw=0.9)
            axes[0, 1].plot(rows.epsilon, rows.mean_kendall_tau, "o-", color=colour, label=label)
        first = table.iloc[0]
        n_clients, n_models, n_draws = (int(first[c]) for c in ("n_clients", "n_models", "n_draws"))
        axes[0, 0].set_ylabel("P(private KD$_\\mathrm{avg}$ agrees with KD$_\\mathrm{all}$)")
        axes[0, 1].set_ylabel(
            "mean Kendall $\\tau$(private KD$_\\mathrm{avg}$, KD$_\\mathrm{all}$)"
        )
        epsilons = sorted(table.epsilon.unique())
        for ax, title in zip(
            axes[0], ("(a) Same ranking (solid), same best (dashed)", "(b) Rank correlation")
        ):
            ax.set_xscale("log")
            ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
            ax.minorticks_off()
            ax.set_xlabel(
                f"client budget $\\varepsilon$ ($\\delta$ = {first.delta:g}, "
                f"over {n_models} models)"
            )
            ax.set_title(title, loc="left")
        axes[0, 0].set_ylim(-0.03, 1.03)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(
            handles,
            labels,
            loc="outside lower center",
            ncols=len(labels),
            title=f"rows per client ({n_clients} clients, {n_draws} draws)",
        )
    return fig
