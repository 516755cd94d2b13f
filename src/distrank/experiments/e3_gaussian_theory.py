r"""E3: Theorem 2 on Gaussians, in closed form (no data, no sampling).

Clients hold Gaussians :math:`P_i = N(\mu_i, C_i)` with weights :math:`\lambda_i`;
the pooled reference is the mixture :math:`\bar P = \sum_i \lambda_i P_i`, whose mean
and covariance are

.. math::
    \bar\mu = \sum_i \lambda_i \mu_i, \qquad
    \bar C = \sum_i \lambda_i C_i + \sum_i \lambda_i (\mu_i - \bar\mu)(\mu_i - \bar\mu)^\top .

A model is a Gaussian :math:`Q = N(\bar\mu, \Sigma)`. With the Fréchet distance

.. math::
    \mathrm{FD}(N(m_1, C_1), N(m_2, C_2)) = \lVert m_1 - m_2 \rVert^2
        + \operatorname{tr}\bigl(C_1 + C_2 - 2 (C_1^{1/2} C_2 C_1^{1/2})^{1/2}\bigr),

:math:`\mathrm{FD}_\mathrm{all}(\Sigma) = \mathrm{FD}(N(\bar\mu, \bar C), Q)` is zero at
:math:`\Sigma = \bar C`, while :math:`\mathrm{FD}_\mathrm{avg}(\Sigma) = \sum_i \lambda_i
\mathrm{FD}(P_i, Q)` is minimised by the Wasserstein-2 barycenter covariance
:math:`\Sigma_B`, the fixed point of
:math:`\Sigma = \sum_i \lambda_i (\Sigma^{1/2} C_i \Sigma^{1/2})^{1/2}`, which lacks the
between-client term (Theorem 2). The two aggregations prefer different models.

KD (squared MMD) with the Gaussian kernel :math:`k(x, y) = \exp(-\lVert x - y\rVert^2 /
(2 s^2))` is also closed form: for :math:`x \sim N(a, A)`, :math:`y \sim N(b, B)`
independent, :math:`x - y \sim N(a - b, A + B)` and

.. math::
    \mathbb E\, k(x, y) = \frac{s^d}{\sqrt{\det(s^2 I + A + B)}}
        \exp\bigl(-\tfrac12 (a - b)^\top (s^2 I + A + B)^{-1} (a - b)\bigr),

so MMD between Gaussian mixtures is a finite sum. Since the cross term is linear in
the reference, :math:`\mathrm{KD}_\mathrm{avg}(\Sigma) - \mathrm{KD}_\mathrm{all}(\Sigma)
= \sum_i \lambda_i \mathbb E_{P_i P_i} k - \mathbb E_{\bar P \bar P} k` for every
:math:`\Sigma` (Theorem 1): both KD curves share their minimiser.

The model family is the affine-invariant geodesic from :math:`\Sigma_B` (t = 0) to
:math:`\bar C` (t = 1),
:math:`C(t) = \Sigma_B^{1/2} (\Sigma_B^{-1/2} \bar C \Sigma_B^{-1/2})^t \Sigma_B^{1/2}`,
positive definite for every real t; since :math:`\Sigma_B` and :math:`\bar C` are the
unique global minimisers of FD_avg and FD_all, the curves' argmins are exactly t = 0
and t = 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from distrank.experiments import Outputs
from distrank.figures import new_figure, paper_style

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TABLES = ("", "_curves")


def run(inputs: Mapping, settings: Mapping, context: Mapping) -> Outputs:
    """E3 needs no data: the settings give the clients and the covariance grid."""
    s = settings
    t = np.round(np.linspace(s["t_min"], s["t_max"], s["n_points"]), 10)
    curves = e3_curves(ring_clients(s["n_clients"], s["dim"]), t, bandwidth=s["bandwidth"])
    return Outputs({"": e3_table(curves), "_curves": curves}, {"": e3_figure(curves)})


__all__ = [
    "GaussianClients",
    "ring_clients",
    "spd_power",
    "gaussian_fd",
    "barycenter_covariance",
    "gaussian_kernel_mean",
    "mixture_kd",
    "covariance_path",
    "e3_curves",
    "e3_table",
    "e3_figure",
]

CURVES = ("FD_all", "FD_avg", "KD_all", "KD_avg")


@dataclass(frozen=True)
class GaussianClients:
    """Client Gaussians ``N(means[i], covs[i])`` with weights summing to one."""

    means: np.ndarray  # (k, d)
    covs: np.ndarray  # (k, d, d)
    weights: np.ndarray  # (k,)

    def __post_init__(self) -> None:
        means = np.asarray(self.means, dtype=np.float64)
        covs = np.asarray(self.covs, dtype=np.float64)
        weights = np.asarray(self.weights, dtype=np.float64)
        if means.ndim != 2:
            raise ValueError(f"means must be (k, d), got shape {means.shape}")
        k, d = means.shape
        if covs.shape != (k, d, d):
            raise ValueError(f"covs must be (k, d, d) = {(k, d, d)}, got {covs.shape}")
        if weights.shape != (k,) or np.any(weights <= 0):
            raise ValueError(f"weights must be {k} positive numbers, got {weights}")
        if not np.allclose(covs, np.swapaxes(covs, 1, 2)) or np.any(np.linalg.eigvalsh(covs) <= 0):
            raise ValueError("covs must be symmetric positive definite")
        object.__setattr__(self, "means", means)
        object.__setattr__(self, "covs", covs)
        object.__setattr__(self, "weights", weights / weights.sum())

    @property
    def pooled_mean(self) -> np.ndarray:
        r""":math:`\bar\mu = \sum_i \lambda_i \mu_i`."""
        return self.weights @ self.means

    @property
    def pooled_covariance(self) -> np.ndarray:
        r""":math:`\bar C`: within-client plus between-client covariance of the mixture."""
        centred = self.means - self.pooled_mean
        within = np.einsum("i,ijk->jk", self.weights, self.covs)
        between = np.einsum("i,ij,ik->jk", self.weights, centred, centred)
        return within + between


def ring_clients(
    n_clients: int = 3,
    dim: int = 2,
    *,
    radius: float = 3.0,
    within_std: float = 0.5,
    aspect: float = 4.0,
    weights: Sequence[float] | None = None,
) -> GaussianClients:
    """Variance-limited clients: means evenly spaced on a circle of ``radius`` in the
    first two coordinates; client i's covariance has standard deviations
    ``within_std * sqrt(aspect)`` along the direction of its mean and
    ``within_std / sqrt(aspect)`` across it (``within_std`` in further dimensions),
    so the clients' covariances differ and do not commute. ``weights`` default to
    uniform.
    """
    if dim < 2 or n_clients < 2:
        raise ValueError("ring_clients needs dim >= 2 and n_clients >= 2")
    angles = 2 * np.pi * np.arange(n_clients) / n_clients
    means = np.zeros((n_clients, dim))
    means[:, 0], means[:, 1] = radius * np.cos(angles), radius * np.sin(angles)
    covs = np.tile(np.eye(dim) * within_std**2, (n_clients, 1, 1))
    for i, a in enumerate(angles):
        rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        covs[i, :2, :2] = rot @ np.diag([within_std**2 * aspect, within_std**2 / aspect]) @ rot.T
    w = np.ones(n_clients) if weights is None else np.asarray(weights, dtype=np.float64)
    return GaussianClients(means, covs, w)


def spd_power(a: np.ndarray, power: float) -> np.ndarray:
    """``a**power`` for a symmetric positive semi-definite matrix (eigendecomposition;
    eigenvalues below zero from rounding are clipped)."""
    vals, vecs = np.linalg.eigh((a + a.T) / 2)
    vals = np.clip(vals, 0.0, None)
    if power < 0 and np.any(vals == 0):
        raise ValueError("negative power of a singular matrix")
    return (vecs * vals**power) @ vecs.T


def gaussian_fd(m1: np.ndarray, c1: np.ndarray, m2: np.ndarray, c2: np.ndarray) -> float:
    r"""Fréchet distance :math:`\lVert m_1 - m_2\rVert^2 + \operatorname{tr}(C_1 + C_2
    - 2 (C_1^{1/2} C_2 C_1^{1/2})^{1/2})` (squared W2 between the Gaussians)."""
    root = spd_power(c1, 0.5)
    cross = np.linalg.eigvalsh(root @ c2 @ root)
    diff = np.asarray(m1, float) - np.asarray(m2, float)
    return float(
        diff @ diff + np.trace(c1) + np.trace(c2) - 2.0 * np.sqrt(np.clip(cross, 0.0, None)).sum()
    )


def barycenter_covariance(
    covs: np.ndarray, weights: np.ndarray, *, tol: float = 1e-14, max_iter: int = 10_000
) -> np.ndarray:
    r"""Covariance of the Wasserstein-2 barycenter of centred Gaussians.

    Fixed-point iteration of Álvarez-Esteban, del Barrio, Cuesta-Albertos and Matrán
    (2016, J. Math. Anal. Appl. 441), which converges from any positive definite start:

    .. math::
        S \leftarrow S^{-1/2} \Bigl(\sum_i \lambda_i (S^{1/2} C_i S^{1/2})^{1/2}\Bigr)^2 S^{-1/2}.

    Stops when the relative change (Frobenius) is below ``tol``.
    """
    covs = np.asarray(covs, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64) / np.sum(weights)
    s = np.einsum("i,ijk->jk", weights, covs)
    for _ in range(max_iter):
        root, inv_root = spd_power(s, 0.5), spd_power(s, -0.5)
        inner = sum(w * spd_power(root @ c @ root, 0.5) for w, c in zip(weights, covs))
        new = inv_root @ inner @ inner @ inv_root
        new = (new + new.T) / 2
        if np.linalg.norm(new - s) <= tol * np.linalg.norm(s):
            return new
        s = new
    raise RuntimeError(f"barycenter iteration did not converge in {max_iter} steps")


def gaussian_kernel_mean(
    a: np.ndarray, cov_a: np.ndarray, b: np.ndarray, cov_b: np.ndarray, bandwidth: float
) -> float:
    r""":math:`\mathbb E\,\exp(-\lVert x - y\rVert^2 / (2 s^2))` for independent
    :math:`x \sim N(a, A)`, :math:`y \sim N(b, B)`:
    :math:`s^d \det(s^2 I + A + B)^{-1/2} \exp(-\frac12 \delta^\top (s^2 I + A + B)^{-1} \delta)`,
    :math:`\delta = a - b`."""
    d = len(a)
    m = bandwidth**2 * np.eye(d) + cov_a + cov_b
    delta = np.asarray(a, float) - np.asarray(b, float)
    _, logdet = np.linalg.slogdet(m)
    quad = delta @ np.linalg.solve(m, delta)
    return float(np.exp(d * np.log(bandwidth) - 0.5 * logdet - 0.5 * quad))


def _mixture_cross(w1, means1, covs1, w2, means2, covs2, bandwidth) -> float:
    return float(
        sum(
            wi * wj * gaussian_kernel_mean(mi, ci, mj, cj, bandwidth)
            for wi, mi, ci in zip(w1, means1, covs1)
            for wj, mj, cj in zip(w2, means2, covs2)
        )
    )


def mixture_kd(
    weights_p: np.ndarray,
    means_p: np.ndarray,
    covs_p: np.ndarray,
    weights_q: np.ndarray,
    means_q: np.ndarray,
    covs_q: np.ndarray,
    bandwidth: float,
) -> float:
    r"""Squared MMD between Gaussian mixtures with the Gaussian kernel:
    :math:`\mathbb E_{PP} k + \mathbb E_{QQ} k - 2\, \mathbb E_{PQ} k`."""
    pp = _mixture_cross(weights_p, means_p, covs_p, weights_p, means_p, covs_p, bandwidth)
    qq = _mixture_cross(weights_q, means_q, covs_q, weights_q, means_q, covs_q, bandwidth)
    pq = _mixture_cross(weights_p, means_p, covs_p, weights_q, means_q, covs_q, bandwidth)
    return pp + qq - 2.0 * pq


def covariance_path(start: np.ndarray, end: np.ndarray, t: float) -> np.ndarray:
    r"""Affine-invariant geodesic :math:`S^{1/2} (S^{-1/2} E S^{-1/2})^t S^{1/2}`:
    ``start`` at t = 0, ``end`` at t = 1, positive definite for all real t."""
    root, inv_root = spd_power(start, 0.5), spd_power(start, -0.5)
    out = root @ spd_power(inv_root @ end @ inv_root, t) @ root
    return (out + out.T) / 2


def e3_curves(clients: GaussianClients, t: Sequence[float], *, bandwidth: float) -> pd.DataFrame:
    """FD_all, FD_avg, KD_all, KD_avg of the models ``N(mu_bar, C(t))`` (closed form).

    ``C(t)`` is :func:`covariance_path` from the barycenter covariance (t = 0) to the
    pooled covariance (t = 1); ``bandwidth`` is the Gaussian kernel's ``s``. Returns
    columns ``t`` and the four curves, in float64.
    """
    t = np.asarray(t, dtype=np.float64)
    if t.ndim != 1 or t.size < 2:
        raise ValueError("t must be a 1-d grid of at least two values")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth}")
    lam, means, covs = clients.weights, clients.means, clients.covs
    mu_bar, c_bar = clients.pooled_mean, clients.pooled_covariance
    sigma_b = barycenter_covariance(covs, lam)
    rows = []
    for ti in t:
        c_t = covariance_path(sigma_b, c_bar, ti)
        model = (np.ones(1), mu_bar[None], c_t[None])
        rows.append(
            {
                "t": float(ti),
                "FD_all": gaussian_fd(mu_bar, c_bar, mu_bar, c_t),
                "FD_avg": float(
                    sum(w * gaussian_fd(m, c, mu_bar, c_t) for w, m, c in zip(lam, means, covs))
                ),
                "KD_all": mixture_kd(lam, means, covs, *model, bandwidth),
                "KD_avg": float(
                    sum(
                        w * mixture_kd(np.ones(1), m[None], c[None], *model, bandwidth)
                        for w, m, c in zip(lam, means, covs)
                    )
                ),
            }
        )
    return pd.DataFrame(rows, columns=["t", *CURVES])


def e3_table(curves: pd.DataFrame) -> pd.DataFrame:
    """Minimiser and minimum of each curve on the grid, and its values at t = 0
    (barycenter covariance) and t = 1 (pooled covariance; NaN if off the grid).

    Columns: ``curve``, ``argmin_t``, ``min_value``, ``value_at_barycenter``,
    ``value_at_pooled_cov``.
    """
    t = curves["t"].to_numpy(float)

    def at(values: np.ndarray, target: float) -> float:
        hit = np.flatnonzero(np.isclose(t, target, atol=1e-9))
        return float(values[hit[0]]) if hit.size else float("nan")

    rows = []
    for name in CURVES:
        values = curves[name].to_numpy(float)
        i = int(np.argmin(values))
        rows.append(
            {
                "curve": name,
                "argmin_t": float(t[i]),
                "min_value": float(values[i]),
                "value_at_barycenter": at(values, 0.0),
                "value_at_pooled_cov": at(values, 1.0),
            }
        )
    return pd.DataFrame(rows)


def e3_figure(curves: pd.DataFrame, *, space: str = r"Gaussians in $\mathbb{R}^2$") -> Figure:
    """Two panels vs t: FD_all and FD_avg (left), KD_all and KD_avg (right), each
    curve's grid argmin marked; dotted lines at t = 0 (barycenter) and t = 1 (pooled
    covariance). ``space`` names where the Gaussians live, for the axis labels."""
    table = e3_table(curves).set_index("curve")
    t = curves["t"].to_numpy(float)
    styles = {"all": dict(color="tab:blue", ls="-"), "avg": dict(color="tab:orange", ls="--")}
    with paper_style():
        fig, axes = new_figure(1, 2, width="double", height=2.6)
        panels = (
            (axes[0, 0], "FD", "(a) Fréchet distance"),
            (axes[0, 1], "KD", "(b) Kernel distance"),
        )
        for ax, metric, title in panels:
            for ref in (0.0, 1.0):
                ax.axvline(ref, color="0.6", lw=0.6, ls=":", zorder=0)
            for agg in ("all", "avg"):
                name = f"{metric}_{agg}"
                row = table.loc[name]
                ax.plot(t, curves[name], label=rf"{metric}$_\mathrm{{{agg}}}$", **styles[agg])
                ax.plot(
                    row["argmin_t"],
                    row["min_value"],
                    marker="o",
                    ms=5,
                    color=styles[agg]["color"],
                    markerfacecolor="white",
                    zorder=3,
                    label=rf"argmin $t$ = {row['argmin_t']:.2f}",
                )
            ax.set_xlabel(r"$t$  ($\Sigma_B$ at $t$=0, $\bar C$ at $t$=1)")
            ax.set_ylabel(f"{metric}, closed form, {space}")
            ax.set_title(title, loc="left")
            ax.legend(loc="upper center", ncols=2, columnspacing=1.0, handlelength=1.8)
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo, hi + 0.25 * (hi - lo))
    return fig
