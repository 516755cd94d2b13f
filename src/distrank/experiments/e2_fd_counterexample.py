r"""E2: Proposition 1 on real features: two models, same FD from every client,
hence the same FD_avg, but very different FD_all. KD tells them apart.

Construction of G2 from a base model G1 (generated or held-out features
:math:`Y_1`, mean :math:`m`, covariance :math:`S`). Client i has reference mean
:math:`\mu_i`, covariance :math:`C_i`, weight :math:`\lambda_i`; let
:math:`e_i = \mu_i - m`, :math:`\bar e = \sum_i \lambda_i e_i`, :math:`b = \operatorname{tr} S`,
:math:`t_i = \operatorname{tr}(C_i^{1/2} S C_i^{1/2})^{1/2}`, :math:`T = \sum_i \lambda_i t_i`.
G2 is G1 shrunk about its mean by a factor :math:`s` and shifted by :math:`v`:

.. math::  Y_2 = m + v + s\,(Y_1 - m),

so (exactly, also for sample statistics) its mean is :math:`m + v` and its covariance
:math:`s^2 S`. As :math:`(C^{1/2} s^2 S C^{1/2})^{1/2} = s (C^{1/2} S C^{1/2})^{1/2}`,

.. math::
    \mathrm{FD}_i(G_2) - \mathrm{FD}_i(G_1) = \lVert v\rVert^2 - 2 v^\top e_i + g_i, \qquad
    g_i = (s^2 - 1) b - 2 (s - 1) t_i .

*Same FD at every client* means :math:`2 v^\top e_i - \lVert v\rVert^2 = g_i` for all i.
Write :math:`\tilde e_i = e_i - \bar e = \mu_i - \bar\mu`. Subtracting the
:math:`\lambda`-average :math:`\bar g` leaves the linear system
:math:`2 \tilde e_i^\top w = g_i - \bar g` (consistent, as both sides average to zero),
solved by the minimum-norm :math:`w_0 \in \operatorname{span}\{\tilde e_i\}` (exact when
the client means are affinely independent, least squares otherwise). The averaged
condition :math:`2 v^\top \bar e - \lVert v\rVert^2 = \bar g` then fixes the rest: with
:math:`\bar e = e_\parallel + e_\perp` split along that span,
:math:`v = w_0 + e_\perp + c\,u` for a unit :math:`u` orthogonal to every :math:`e_i` and

.. math::  c^2 = 2 w_0^\top e_\parallel + \lVert e_\perp\rVert^2 - \lVert w_0\rVert^2 - \bar g .

FD_avg then matches whatever :math:`w_0` achieves, while (averaging the per-client
condition and using :math:`t_\mathrm{all} = \operatorname{tr}(\bar C^{1/2} S \bar C^{1/2})^{1/2}`)

.. math::  \mathrm{FD}_\mathrm{all}(G_2) - \mathrm{FD}_\mathrm{all}(G_1) = 2 (1 - s)(t_\mathrm{all} - T),

and :math:`t_\mathrm{all} \ge T` (the fidelity term is concave and monotone in the
covariance, and :math:`\bar C \succeq \sum_i \lambda_i C_i`): on variance-limited
clients (small :math:`C_i`, large between-client spread) :math:`t_\mathrm{all} \gg T`.
The default :math:`s = T / b` minimises FD_avg over pure rescalings, so
:math:`\bar g = -(b - T)^2 / b \le 0` and :math:`c^2 > 0` in the usual case; if
:math:`c^2 < 0`, :math:`s` is moved halfway to 1, repeatedly, until it is not.

Only per-client and G1 Gaussian statistics are used; the FDs are evaluated with
:func:`distrank.metrics.fd.frechet_distances`, the scorer's own implementation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

import distrank.metrics._table
from distrank.clients import client_weights
from distrank.experiments import Job, Outputs, collected
from distrank.figures import metric_label, metric_name, new_figure, paper_style

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "G1",
    "G2",
    "G2Design",
    "design_g2",
    "construct_g2",
    "write_models",
    "e2_table",
    "e2_figure",
    "run",
]

#: The two models of the experiment, built in feature space by :func:`write_models`.
G1, G2 = "e2-G1", "e2-G2"


def check(settings: Mapping, config: Mapping) -> None:
    from distrank.experiments import check_model

    check_model(config, "experiments.E2.base_model", settings["base_model"])


def scores(settings: Mapping, config: Mapping) -> tuple[str, list[str]]:
    return settings["partition"], [G1, G2]


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    table = e2_table(collected(inputs, context), g1=G1, g2=G2)
    return Outputs({"": table}, {"": e2_figure(table, context["extractor"])})


def write_models(
    client_paths: Sequence, base_path, g1_path, g2_path, *, classes: Sequence[int] | None, seed: int
) -> None:
    """Centralized pre-step: G1 is the base model's features, restricted to the
    clients' classes when both are known; G2 is :func:`construct_g2` from the pooled
    client features."""
    from distrank._io import atomic_path
    from distrank.features.cache import load_features, load_labelled

    parts = [load_features(p) for p in client_paths]
    reference = np.concatenate(parts)
    clients = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    g1, labels = load_labelled(base_path)
    if classes is not None and labels is not None:
        g1 = g1[np.isin(labels, classes)]
    g2 = construct_g2(reference, clients, g1, random_state=seed)
    for path, feats in ((g1_path, g1), (g2_path, g2)):
        with atomic_path(path) as tmp:
            np.savez(tmp, features=feats)


def models_centralized(job: Job) -> None:
    """Pre-step ``e2_models_centralized``: :func:`write_models` on the rule's files."""
    write_models(
        job.inputs["clients"],
        job.inputs["base"],
        job.outputs["g1"],
        job.outputs["g2"],
        **job.args("classes", "seed"),
    )


STEPS = {"e2_models_centralized": models_centralized}


@dataclass(frozen=True)
class G2Design:
    """How G2 is built from G1: ``Y2 = center + shift + scale * (Y1 - center)``."""

    center: np.ndarray  # (d,) mean m of Y1
    shift: np.ndarray  # (d,) v
    scale: float  # s
    fd_client_g1: np.ndarray  # (k,) FD of G1 at each client
    fd_client_change: np.ndarray  # (k,) predicted FD_i(G2) - FD_i(G1) (0 when exact)
    fd_all_change: float  # predicted FD_all(G2) - FD_all(G1)

    def apply(self, y1: np.ndarray) -> np.ndarray:
        y1 = np.asarray(y1, dtype=np.float64)
        return self.center + self.shift + self.scale * (y1 - self.center)


def _unit_normal_to(directions: np.ndarray, d: int, random_state: int) -> np.ndarray:
    """A seeded random unit vector orthogonal to the rows of ``directions``."""
    basis, _ = np.linalg.qr(directions.T) if len(directions) else (np.zeros((d, 0)), None)
    u = np.random.default_rng(random_state).standard_normal(d)
    for _ in range(2):  # twice: orthogonal to rounding
        u -= basis @ (basis.T @ u)
    return u / np.linalg.norm(u)


def _solve_shift(
    e: np.ndarray, lam: np.ndarray, g: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """The parts of ``v`` fixed by the client conditions: ``(w0 + e_perp, basis, c^2)``.

    ``basis`` (rows) spans the centred client means and ``e_perp``; the free part
    ``c u`` must be orthogonal to it.
    """
    e_bar = lam @ e
    u_svd, sv, vt = np.linalg.svd(e - e_bar, full_matrices=False)
    rank = int(np.sum(sv > 1e-10 * sv[0])) if sv.size and sv[0] > 0 else 0
    span = vt[:rank]
    g_bar = float(lam @ g)
    w0 = span.T @ ((u_svd[:, :rank].T @ ((g - g_bar) / 2)) / sv[:rank])  # min-norm least squares
    e_par = span.T @ (span @ e_bar)
    e_perp = e_bar - e_par
    c2 = float(2 * w0 @ e_par + e_perp @ e_perp - w0 @ w0 - g_bar)
    basis = np.vstack([span, e_perp[None]]) if np.linalg.norm(e_perp) > 0 else span
    return w0 + e_perp, basis, c2


def design_g2(
    reference: np.ndarray,
    clients: np.ndarray,
    y1: np.ndarray,
    *,
    scale: float | None = None,
    weights: str = "size",
    random_state: int = 0,
) -> G2Design:
    """Solve the construction in the module docstring.

    Parameters
    ----------
    reference : (n, d) pooled client reference features.
    clients : (n,) client label of each reference row.
    y1 : (m, d) features of G1.
    scale : shrink factor ``s > 0``; ``None`` = ``T / b`` (the FD_avg-optimal
        rescaling of G1), moved halfway towards 1 while infeasible. An explicit
        ``scale`` that admits no real shift raises ``ValueError``.
    weights : client weights, ``"size"`` (n_i / n) or ``"uniform"``.
    random_state : seed for the direction ``u`` of the free part of the shift.
    """
    from distrank.metrics.fd._frechet import frechet_distances, gaussian_stats, pool_stats

    reference = np.asarray(reference, dtype=np.float64)
    clients = np.asarray(clients)
    y1 = np.asarray(y1, dtype=np.float64)
    if reference.ndim != 2 or y1.ndim != 2 or reference.shape[1] != y1.shape[1]:
        raise ValueError(
            f"reference {reference.shape} and y1 {y1.shape} must be 2-d with equal width"
        )
    if clients.shape != (len(reference),):
        raise ValueError(
            f"clients must have one label per reference row, got shape {clients.shape}"
        )
    labels = np.unique(clients)
    k, d = len(labels), y1.shape[1]
    if k < 2 or d <= k + 1:
        raise ValueError(
            f"need at least two clients and more than k + 1 feature dimensions (k={k}, d={d})"
        )
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be positive, got {scale}")

    client_stats = [gaussian_stats(reference[clients == c]) for c in labels]
    g1 = gaussian_stats(y1)
    lam = client_weights([st.n for st in client_stats], weights)
    m, b = g1.mean, float(np.trace(g1.cov))
    everyone = [*client_stats, pool_stats(client_stats)]
    fds = frechet_distances(everyone, [g1])[:, 0]
    # FD(P, G1) = |mu_P - m|^2 + tr C_P + b - 2 t_P: the fidelity terms t_P follow
    # from the scorer's own FD, so G2 is matched under exactly the metric reported.
    offsets = np.stack([st.mean for st in everyone]) - m
    traces = np.array([np.trace(st.cov) for st in everyone])
    fidelity = (np.einsum("ij,ij->i", offsets, offsets) + traces + b - fds) / 2
    e, t, t_all = offsets[:k], fidelity[:k], float(fidelity[k])
    t_avg = float(lam @ t)

    s = t_avg / b if scale is None else float(scale)
    for _ in range(60):
        g = (s**2 - 1) * b - 2 * (s - 1) * t
        fixed, basis, c2 = _solve_shift(e, lam, g)
        if c2 >= 0 or scale is not None:
            break
        s = 1 - (1 - s) / 2
    if c2 < 0:
        raise ValueError(
            f"no real shift for scale {s:.6g} (c^2 = {c2:.3g}); choose a scale nearer 1"
        )
    shift = fixed + np.sqrt(c2) * _unit_normal_to(basis, d, random_state)
    return G2Design(
        center=m,
        shift=shift,
        scale=s,
        fd_client_g1=fds[:k],
        fd_client_change=shift @ shift - 2 * e @ shift + g,
        fd_all_change=float(2 * (1 - s) * (t_all - t_avg)),
    )


def construct_g2(
    reference: np.ndarray, clients: np.ndarray, y1: np.ndarray, **options
) -> np.ndarray:
    """G2 features (float64, same shape as ``y1``): same per-client FD and FD_avg as
    G1, different FD_all. Arguments and ``options`` (``scale``, ``weights``,
    ``random_state``) as in :func:`design_g2`.

    Storing the result as float32 perturbs the FD match by about float32 rounding
    (relative 1e-6 or less).
    """
    return design_g2(reference, clients, y1, **options).apply(y1)


def e2_table(scores: pd.DataFrame, *, g1: str = "G1", g2: str = "G2") -> pd.DataFrame:
    """Per-client FD and KD of G1 and G2, then rows ``avg`` and ``all``.

    ``scores`` is a tidy score table with ``fd`` and ``kd`` rows (aggregations
    ``client``, ``avg``, ``all``) for the models named ``g1`` and ``g2``. Columns:
    ``client``, ``FD_G1``, ``FD_G2``, ``FD_rel_diff`` ((G2 - G1) / G1), ``KD_G1``,
    ``KD_G2``, ``KD_rel_diff``.
    """
    distrank.metrics._table.check(scores, ("fd", "kd"))
    rows = scores[scores["model"].isin([g1, g2]) & scores["metric"].isin(["fd", "kd"])].copy()
    for model in (g1, g2):
        if model not in set(rows["model"]):
            raise ValueError(f"scores has no rows for model {model!r}")
    rows["row"] = np.where(
        rows["aggregation"] == "client", rows["client"].astype(str), rows["aggregation"]
    )
    rows["role"] = rows["model"].map({g1: "G1", g2: "G2"})
    wide = rows.pivot_table(
        index="row", columns=["metric", "role"], values="value", aggfunc="first"
    )
    client_rows = sorted(
        (r for r in wide.index if r not in ("avg", "all")),
        key=lambda r: (0, float(r)) if r.lstrip("-").replace(".", "", 1).isdigit() else (1, r),
    )
    order = [*client_rows, "avg", "all"]
    missing = [r for r in order if r not in wide.index] + [
        r for r in ("avg", "all") if r not in wide.index
    ]
    if missing:
        raise ValueError(f"scores lack rows {sorted(set(missing))}")
    wide = wide.loc[order]
    out = pd.DataFrame({"client": order})
    for metric, name in (("fd", "FD"), ("kd", "KD")):
        v1 = wide[(metric, "G1")].to_numpy(float)
        v2 = wide[(metric, "G2")].to_numpy(float)
        out[f"{name}_G1"], out[f"{name}_G2"] = v1, v2
        out[f"{name}_rel_diff"] = (v2 - v1) / v1
    return out


def e2_figure(table: pd.DataFrame, extractor: str) -> Figure:
    """Grouped bars, G1 vs G2, per client and for the aggregates avg and all
    (right of the dotted line); FD panel on top, KD below. Aggregate bars carry
    their values. ``table`` is the output of :func:`e2_table`."""
    labels = table["client"].astype(str).tolist()
    n_clients = len(labels) - 2
    x = np.arange(len(labels), dtype=float)
    x[n_clients:] += 0.6
    width = 0.38
    colors = {"G1": "tab:blue", "G2": "tab:orange"}
    with paper_style():
        fig, axes = new_figure(2, 1, width="double", height=4.4)
        for ax, metric in ((axes[0, 0], "fd"), (axes[1, 0], "kd")):
            name, shown = metric.upper(), metric_name(metric, extractor)
            top = 0.0
            for j, role in enumerate(("G1", "G2")):
                values = table[f"{name}_{role}"].to_numpy(float)
                top = max(top, float(np.nanmax(values)))
                bars = ax.bar(x + (j - 0.5) * width, values, width, color=colors[role], label=role)
                for bar, value in list(zip(bars, values))[n_clients:]:
                    ax.annotate(
                        f"{value:.4g}",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        xytext=(0, 2),
                        textcoords="offset points",
                        ha="center",
                        va="bottom",
                        rotation=90,
                    )
            ax.axvline((x[n_clients - 1] + x[n_clients]) / 2, color="0.6", lw=0.6, ls=":")
            ax.set_ylim(0, top * 1.4)
            ticks = [f"client {c}" for c in labels[:n_clients]]
            ticks += [rf"{shown}$_\mathrm{{{agg}}}$" for agg in labels[n_clients:]]
            ax.set_xticks(x, ticks)
            ax.set_ylabel(metric_label(metric, extractor).replace(" on ", "\non "))
            ax.legend(loc="upper left", ncols=2)
    return fig
