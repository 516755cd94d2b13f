r"""A2, gradient boosting: disagreement after :math:`k` rounds.

Boosting for squared loss from :math:`f_0 = 0`, without shrinkage, adds in round
:math:`t` a weak learner :math:`g_t` from a symmetric class :math:`C` (norm at most
one) with the exact line-search step. Both runs of a pair approach the best fit in
:math:`\mathrm{span}(C)`, whose closure holds their average, and the anchoring
argument gives, for any two runs (Eaton et al., arXiv:2602.23360, boosting theorem),

.. math::
    D(f_k, f'_k) \le \frac{32\,\tau_*^2}{k} + 2\,(\text{oracle errors})^2,

:math:`\tau_*` the atomic norm of the best fit in :math:`\mathrm{span}(C)` (smallest
:math:`\sum |c_j|` with :math:`\sum c_j g_j` equal to it).

Two settings:

- :func:`boosting_pairs`: scikit-learn's ``GradientBoostingRegressor`` (depth-limited
  trees, ``learning_rate=1``, ``init="zero"``; leaf values are the residual means,
  the exact line search per leaf) on independent training samples; the weak-learner
  oracle is a tree fit to the training residuals, so its error is the sampling error,
  and :math:`\tau_*` of a tree class is not computable. Reported from the same runs:
  the learning-curve plug-in bound (:func:`~distrank.agreement.core.lemma_bound`, a
  :math:`k`-round average is a :math:`2k`-round model) and the anchor bound with
  :math:`R(\overline{\mathrm{span}}\,C)` replaced by the Bayes risk, valid as
  :math:`R \ge` Bayes (equal for Friedman #1 and depth >= 2, whose regression
  function is a sum of functions of two coordinates).
- :func:`exact_oracle_pairs`: pure greedy boosting over a finite symmetric dictionary
  of unit-norm atoms on a finite :math:`P`, with the exact oracle (oracle error zero;
  exact ties broken at random, so the runs differ) and :math:`\tau_*` computed by a
  linear program: the setting in which the :math:`1/k` term is the whole bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from scipy import optimize
from sklearn.ensemble import GradientBoostingRegressor

from distrank.agreement.core import (
    Seed,
    check_resources,
    lemma_bound,
    loglog_slope,
    midpoint_terms,
    model_seed,
    pair_rngs,
    summarize,
)
from distrank.agreement.data import Population
from distrank.agreement.figures import agreement_figure

__all__ = [
    "boosting_pairs",
    "equicorrelated_dictionary",
    "atomic_norm",
    "greedy_boost",
    "exact_oracle_pairs",
    "boosting_summary",
    "boosting_figure",
]

EXACT = "exact_oracle"


def _staged(
    model: GradientBoostingRegressor, X: np.ndarray, stages: Sequence[int]
) -> dict[int, np.ndarray]:
    wanted = set(stages)
    return {k: pred for k, pred in enumerate(model.staged_predict(X), start=1) if k in wanted}


def boosting_pairs(
    population: Population,
    ks: Sequence[int],
    *,
    n_train: int,
    max_depth: int,
    n_pairs: int,
    seed: Seed,
) -> pd.DataFrame:
    r"""Pairs of ``GradientBoostingRegressor`` runs (own training sample and seed each),
    every :math:`k` read from one fit of ``2 max(ks)`` rounds.

    Columns: ``data, resource (k), pair``, the midpoint terms, ``mse_g1, mse_g2``
    (MSEs after :math:`2k` rounds), the ``lemma_bound`` terms, ``R_B`` (the Bayes
    risk, NaN where unknown), ``bound_bayes``
    (:math:`2(\mathrm{MSE}(f_1) - R_B) + 2(\mathrm{MSE}(f_2) - R_B)`) and ``oracle_gap``
    (test minus training MSE,
    mean over the two runs: the part of the error due to fitting weak learners on a
    sample instead of :math:`P`).
    """
    ks = check_resources(ks, "ks")
    stages = sorted(set(ks) | {2 * k for k in ks})
    bayes = np.nan if population.bayes_mse is None else population.bayes_mse
    rows = []
    for pair, rng1, rng2 in pair_rngs(seed, n_pairs):
        test, gap = [], []
        for rng in (rng1, rng2):
            X, y = population.draw(n_train, rng)
            model = GradientBoostingRegressor(
                loss="squared_error",
                learning_rate=1.0,
                n_estimators=stages[-1],
                max_depth=max_depth,
                init="zero",
                subsample=1.0,
                random_state=model_seed(rng),
            ).fit(X, y)
            test.append(_staged(model, population.X, stages))
            train = _staged(model, X, ks)
            gap.append(
                {
                    k: float(
                        np.mean((population.y - test[-1][k]) ** 2) - np.mean((y - train[k]) ** 2)
                    )
                    for k in ks
                }
            )
        mse = [{k: float(np.mean((population.y - p) ** 2)) for k, p in t.items()} for t in test]
        for k in ks:
            terms = midpoint_terms(population.y, test[0][k], test[1][k])
            lemma = lemma_bound(mse[0][k], mse[1][k], mse[0][2 * k], mse[1][2 * k])
            rows.append(
                {
                    "data": population.name,
                    "resource": k,
                    "pair": pair,
                    **terms,
                    "mse_g1": mse[0][2 * k],
                    "mse_g2": mse[1][2 * k],
                    **{name: float(v) for name, v in lemma.items()},
                    "R_B": bayes,
                    "bound_bayes": 2 * (terms["mse_f1"] - bayes) + 2 * (terms["mse_f2"] - bayes),
                    "oracle_gap": (gap[0][k] + gap[1][k]) / 2,
                }
            )
    return pd.DataFrame(rows)


def equicorrelated_dictionary(p: int, rho: float, scale: float) -> tuple[np.ndarray, np.ndarray]:
    r"""A symmetric dictionary :math:`C = \{\pm a_1, \dots, \pm a_p\}` on :math:`P`
    uniform over :math:`m = p + 1` points and the target :math:`y = (s/p) \sum_j a_j`.

    :math:`a_j = \sqrt{1 - \rho}\, e_j + \sqrt\rho\, e_0` for an orthonormal basis
    :math:`e_0..e_p` of :math:`L_2(P)` (:math:`e_i = \sqrt m\, 1_{\{i\}}`), so
    :math:`\lVert a_j\rVert = 1` and :math:`\langle a_i, a_j\rangle = \rho` for
    :math:`i \ne j`. Every :math:`a_j` plays the same role, so the exact oracle meets
    ties and two runs that break them differently disagree. Returns ``(atoms, y)``,
    atoms as ``(m, 2p)`` columns.
    """
    if not (isinstance(p, int) and p >= 2) or not 0 <= rho < 1 or not scale > 0:
        raise ValueError(
            f"need integer p >= 2, 0 <= rho < 1, scale > 0; got p={p}, rho={rho}, scale={scale}"
        )
    basis = np.sqrt(p + 1) * np.eye(p + 1)
    atoms = np.sqrt(1 - rho) * basis[:, 1:] + np.sqrt(rho) * basis[:, [0]]
    return np.hstack([atoms, -atoms]), scale * atoms.mean(axis=1)


def atomic_norm(atoms: np.ndarray, target: np.ndarray) -> float:
    r""":math:`\min \sum_j c_j` over :math:`c \ge 0` with ``atoms @ c = target``, the
    atomic norm of ``target`` for a symmetric dictionary (``scipy.optimize.linprog``,
    HiGHS); ``ValueError`` if ``target`` is not in the span."""
    res = optimize.linprog(
        np.ones(atoms.shape[1]), A_eq=atoms, b_eq=target, bounds=(0, None), method="highs"
    )
    if res.status != 0:
        raise ValueError(f"atomic_norm: linprog failed ({res.message}); is the target in the span?")
    return float(res.fun)


def greedy_boost(
    atoms: np.ndarray, y: np.ndarray, n_rounds: int, *, rng: np.random.Generator, tol: float = 1e-9
) -> np.ndarray:
    r"""Pure greedy boosting from :math:`f_0 = 0` with the exact oracle and exact line search:
    :math:`g_t = \arg\max_{g \in C} \langle y - f_{t-1}, g\rangle_P`,
    :math:`f_t = f_{t-1} + \langle y - f_{t-1}, g_t\rangle_P\, g_t` (unit-norm atoms).
    Atoms within ``tol`` (relative) of the maximum count as tied; ``rng`` picks one.
    Returns ``(n_rounds, m)``: :math:`f_1, \dots, f_{n}` on the points of :math:`P`."""
    m = len(y)
    f, out = np.zeros(m), np.empty((n_rounds, m))
    for t in range(n_rounds):
        corr = atoms.T @ (y - f) / m
        best = corr.max()
        tied = np.flatnonzero(corr >= best - tol * max(1.0, abs(best)))
        j = tied[rng.integers(len(tied))]
        f = f + corr[j] * atoms[:, j]
        out[t] = f
    return out


def exact_oracle_pairs(
    ks: Sequence[int], *, p: int, rho: float, scale: float, n_pairs: int, seed: Seed
) -> pd.DataFrame:
    r"""Pairs of :func:`greedy_boost` runs on :func:`equicorrelated_dictionary` (the
    runs differ only in how they break exact ties). Columns: ``data, resource, pair``,
    the midpoint terms, ``tau`` (:math:`\tau_*`, here of :math:`y` itself, which lies
    in the span) and ``rate_bound`` :math:`32\tau_*^2/k`."""
    ks = check_resources(ks, "ks")
    atoms, y = equicorrelated_dictionary(p, rho, scale)
    tau = atomic_norm(atoms, y)
    rows = []
    for pair, rng1, rng2 in pair_rngs(seed, n_pairs):
        run1, run2 = (greedy_boost(atoms, y, ks[-1], rng=rng) for rng in (rng1, rng2))
        for k in ks:
            terms = midpoint_terms(y, run1[k - 1], run2[k - 1])
            rows.append(
                {
                    "data": EXACT,
                    "resource": k,
                    "pair": pair,
                    **terms,
                    "tau": tau,
                    "rate_bound": 32 * tau**2 / k,
                }
            )
    return pd.DataFrame(rows)


BOUNDS = {EXACT: ("rate_bound",), "default": ("bound", "bound_bayes")}


def boosting_summary(pairs: pd.DataFrame, *, gap_fraction: float = 0.1) -> pd.DataFrame:
    r"""Per data set and :math:`k`: :func:`~distrank.agreement.core.summarize` with the
    bounds of its setting (flags from the first: the plug-in lemma bound for
    ``GradientBoostingRegressor`` runs, :math:`32\tau_*^2/k` for the exact oracle),
    ``oracle_negligible`` (the mean oracle gap is at most ``gap_fraction`` of the mean
    excess risk :math:`\mathrm{MSE} - R_B`; always true for the exact oracle, where it
    is zero) and per data set the log-log slope of mean :math:`D` on :math:`k` over all
    :math:`k` (``slope``, with ``slope_lo``, ``slope_hi``) and over the
    oracle-negligible :math:`k` (``slope_negligible``; NaN if fewer than three)."""
    parts = []
    for data, rows in pairs.groupby("data", sort=False):
        part = summarize(rows, bounds=BOUNDS.get(data, BOUNDS["default"]))
        grouped = rows.groupby("resource", sort=True)
        if data == EXACT:
            part["oracle_negligible"] = True
        else:
            excess = (grouped["mse_f1"].mean() + grouped["mse_f2"].mean()) / 2 - grouped[
                "R_B"
            ].first()
            part["oracle_negligible"] = (
                grouped["oracle_gap"].mean() <= gap_fraction * excess
            ).to_numpy()
        part = part.assign(**loglog_slope(part["resource"], part["D_mean"]))
        keep = part["oracle_negligible"].to_numpy(dtype=bool)
        part["slope_negligible"] = (
            loglog_slope(part["resource"][keep], part["D_mean"][keep])["slope"]
            if keep.sum() >= 3
            else np.nan
        )
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def _rate_reference(ax: Axes, rows: pd.DataFrame) -> None:
    """A dotted :math:`c/k` line through the first point, to read the slope against."""
    k = rows["resource"].to_numpy(dtype=float)
    ax.plot(
        k,
        rows["D_mean"].iloc[0] * k[0] / k,
        color="0.5",
        ls=(0, (1, 2)),
        lw=0.9,
        label="slope $-1$ ($1/k$)",
    )


def boosting_figure(summary: pd.DataFrame) -> Figure:
    """:math:`D` against rounds :math:`k` (log-log), one panel per setting."""
    return agreement_figure(
        summary,
        resource_label="boosting rounds, $k$",
        logy=True,
        bounds={
            "bound": r"plug-in $4(\hat R_k - \hat R_{2k} + \hat\varepsilon)$",
            "bound_bayes": r"anchor bound, $R(\overline{\mathrm{span}}\,C)$ = Bayes",
            "rate_bound": r"$32\tau_*^2/k$",
        },
        titles={EXACT: "exact oracle, tied atoms"},
        decorate=_rate_reference,
    )
