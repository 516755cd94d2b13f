r"""What every family of the agreement study shares: the midpoint identity, the
learning-curve bound, the pair runner, intervals over pairs and the summary.

Notation (Eaton, Goel, Hussing, Kearns, Roth, Sengupta, Sorrell, "Model Agreement via
Anchoring", arXiv:2602.23360, 2026): for models :math:`f_1, f_2` and
:math:`\bar f = (f_1 + f_2)/2`, with expectations under the evaluation distribution
:math:`P` (a large fresh sample, or every row of a finite set),

.. math::
    D(f_1, f_2) = \mathbb E \lVert f_1(x) - f_2(x) \rVert^2
        = 2\bigl(\mathrm{MSE}(f_1) + \mathrm{MSE}(f_2) - 2\,\mathrm{MSE}(\bar f)\bigr),

exactly, on any distribution (expand :math:`\lVert a\rVert^2 + \lVert b\rVert^2 -
\tfrac12\lVert a + b\rVert^2 = \tfrac12\lVert a - b\rVert^2` with
:math:`a = y - f_1`, :math:`b = y - f_2`). For a :math:`\mu`-strongly convex loss the
identity becomes the inequality :math:`D \le (4/\mu)(R(f_1) + R(f_2) - 2R(\bar f))`
(squared loss: :math:`\mu = 2`, equality).

Pair tables name a model's risk as the spec does (shared/agreement.md): ``mse_f1``,
``mse_f2``, ``mse_fbar`` for the pair at resource :math:`p` and ``mse_g1``, ``mse_g2``
for the same runs at :math:`2p`, under squared loss; under another loss ``risk_``
replaces ``mse_`` (:func:`risk_column`), and a table over several losses (A6) says
``risk_`` throughout, the MSE on its squared-loss rows (:func:`as_risks`).

A pair is two runs with independent training samples and independent seeds; run
``2 i`` and ``2 i + 1`` form pair ``i``, each from its own child of
``numpy.random.SeedSequence(seed)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pandas as pd
from scipy import special, stats

from distrank.agreement.data import Population

__all__ = [
    "LOSSES",
    "midpoint_terms",
    "loss_terms",
    "risk_column",
    "as_risks",
    "lemma_bound",
    "Seed",
    "child_seed",
    "pair_rngs",
    "model_seed",
    "logistic_mu",
    "learning_curve_pairs",
    "mean_ci",
    "summarize",
    "lemma_summary",
    "loglog_slope",
    "check_resources",
]


def _rows(values: np.ndarray) -> np.ndarray:
    """``(m,)`` or ``(m, d)`` as ``(m, d)`` float64."""
    values = np.asarray(values, dtype=np.float64)
    return values.reshape(len(values), -1)


def _squared_error(y: np.ndarray, f: np.ndarray) -> np.ndarray:
    r""":math:`\lVert y - f\rVert^2` per row (outputs summed)."""
    return np.sum((_rows(y) - _rows(f)) ** 2, axis=1)


def _logistic_loss(y: np.ndarray, f: np.ndarray) -> np.ndarray:
    r""":math:`\log(1 + e^{f}) - y f` per row (labels :math:`y \in \{0, 1\}`, logits :math:`f`)."""
    y, f = _rows(y), _rows(f)
    return np.sum(np.logaddexp(0.0, f) - y * f, axis=1)


#: Per-row losses by name.
LOSSES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "squared": _squared_error,
    "logistic": _logistic_loss,
}


def risk_column(loss: str, model: str) -> str:
    """Pair-table column of ``model``'s risk (``"f1"``, ``"fbar"``, ``"g2"``, ...):
    ``mse_<model>`` under squared loss, else ``risk_<model>``."""
    return f"{'mse' if loss == 'squared' else 'risk'}_{model}"


def as_risks(pairs: pd.DataFrame) -> pd.DataFrame:
    """``pairs`` with every ``mse_<model>`` column named ``risk_<model>``: the names of
    a table that holds pairs of several losses."""
    return pairs.rename(columns=lambda c: f"risk_{c[4:]}" if c.startswith("mse_") else c)


def midpoint_terms(y: np.ndarray, f1: np.ndarray, f2: np.ndarray) -> dict[str, float]:
    r"""MSEs of :math:`f_1, f_2, \bar f` and :math:`D(f_1, f_2)` on one evaluation sample.

    .. math::
        D = \mathbb E\lVert f_1 - f_2\rVert^2, \qquad
        \mathrm{identity\_residual} = D - 2\bigl(\mathrm{MSE}(f_1) + \mathrm{MSE}(f_2)
            - 2\,\mathrm{MSE}(\bar f)\bigr),

    the residual being zero up to float rounding (the midpoint identity is exact).
    ``y``, ``f1``, ``f2`` are ``(m,)`` or ``(m, d)`` (outputs summed).

    Parameters
    ----------
    y, f1, f2 : array_like, shape (m,) or (m, d)
        Targets and the two models' predictions on the evaluation sample, of one shape.

    Returns
    -------
    dict of str to float
        ``mse_f1``, ``mse_f2``, ``mse_fbar``, ``D`` and ``identity_residual``.
    """
    terms = loss_terms(y, f1, f2, loss="squared")
    return {
        **{k: terms[k] for k in ("mse_f1", "mse_f2", "mse_fbar", "D")},
        "identity_residual": terms["D"] - terms["midpoint_bound"],
    }


def loss_terms(
    y: np.ndarray, f1: np.ndarray, f2: np.ndarray, *, loss: str, mu: float = 2.0
) -> dict[str, float]:
    r"""Risks of :math:`f_1, f_2, \bar f` under ``loss`` (named by :func:`risk_column`),
    :math:`D`, and the midpoint bound
    :math:`(4/\mu)(R(f_1) + R(f_2) - 2 R(\bar f))`, which is :math:`\ge D` when the loss
    is :math:`\mu`-strongly convex on the segment between the two predictions (for
    squared loss, :math:`\mu = 2`, it equals :math:`D`).

    Parameters
    ----------
    y, f1, f2 : array_like, shape (m,) or (m, d)
        Targets and the two models' predictions (logits for logistic loss), of one shape.
    loss : {"squared", "logistic"}
        A key of :data:`LOSSES`.
    mu : float, default 2.0
        The strong-convexity constant :math:`\mu`, positive.

    Returns
    -------
    dict of str to float
        The risks of ``f1``, ``f2``, ``fbar`` (:func:`risk_column`), ``D``, ``midpoint_bound``.

    Raises
    ------
    ValueError
        If ``loss`` is unknown, ``mu`` is not positive, or the shapes differ.
    """
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {loss!r}")
    if not mu > 0:
        raise ValueError(f"mu must be positive, got {mu}")
    y, f1, f2 = _rows(y), _rows(f1), _rows(f2)
    if not (y.shape == f1.shape == f2.shape):
        raise ValueError(f"y, f1, f2 must have one shape, got {y.shape}, {f1.shape}, {f2.shape}")
    per_row = LOSSES[loss]
    r1, r2 = float(np.mean(per_row(y, f1))), float(np.mean(per_row(y, f2)))
    rbar = float(np.mean(per_row(y, (f1 + f2) / 2)))
    return {
        risk_column(loss, "f1"): r1,
        risk_column(loss, "f2"): r2,
        risk_column(loss, "fbar"): rbar,
        "D": float(np.mean(np.sum((f1 - f2) ** 2, axis=1))),
        "midpoint_bound": 4.0 / mu * (r1 + r2 - 2.0 * rbar),
    }


def lemma_bound(risk_f1, risk_f2, risk_g1, risk_g2, *, mu: float = 2.0) -> dict[str, np.ndarray]:
    r"""Plug-in terms of the learning-curve lemma for one pair at resource :math:`p`.

    :math:`f_1, f_2` are the pair's models at resource :math:`p`, :math:`g_1, g_2` the
    same runs' models at :math:`2p` (where the average of two :math:`p`-models lives).
    With :math:`\hat R_p = \min R(f_i)`, :math:`\hat\varepsilon = \lvert R(f_1) - R(f_2) \rvert`
    (so both :math:`f_i` are :math:`\hat\varepsilon`-near :math:`\hat R_p`) and
    :math:`\hat R_{2p} = \min R(g_i)`:

    .. math::
        \mathrm{bound} = \frac{8}{\mu}\bigl(\hat R_p - \hat R_{2p} + \hat\varepsilon\bigr),
        \qquad
        \mathrm{bound\_anchor} = \frac{4}{\mu}\bigl(R(f_1) + R(f_2) - 2\hat R_{2p}\bigr)
            \le \mathrm{bound}

    (:math:`8/\mu = 4` for squared loss, the lemma's :math:`4(R(F_n) - R(F_{2n}) +
    \varepsilon)`). Both hold whenever :math:`\hat R_{2p} \le R(\bar f)`; since a trained
    model only bounds :math:`R(F_{2p})` from above, they fail (fall below :math:`D`, or
    below zero) where training at :math:`2p` is far from optimal, e.g. overfitting.
    Works elementwise on arrays.

    Parameters
    ----------
    risk_f1, risk_f2, risk_g1, risk_g2 : float or array_like
        Risks of :math:`f_1, f_2` (at :math:`p`) and :math:`g_1, g_2` (at :math:`2p`).
    mu : float, default 2.0
        The strong-convexity constant :math:`\mu`.

    Returns
    -------
    dict of str to numpy.ndarray
        ``R_p``, ``eps``, ``R_2p``, ``bound``, ``bound_anchor``: float64, broadcast shape.
    """
    r1, r2, g1, g2 = (np.asarray(v, dtype=np.float64) for v in (risk_f1, risk_f2, risk_g1, risk_g2))
    r_p, eps, r_2p = np.minimum(r1, r2), np.abs(r1 - r2), np.minimum(g1, g2)
    return {
        "R_p": r_p,
        "eps": eps,
        "R_2p": r_2p,
        "bound": 8.0 / mu * (r_p - r_2p + eps),
        "bound_anchor": 4.0 / mu * (r1 + r2 - 2.0 * r_2p),
    }


def check_resources(resources: Sequence[int], name: str = "resources") -> list[int]:
    """Sorted distinct positive integers, or ``ValueError`` naming ``name``."""
    values = list(resources)
    if not values or any(
        not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1 for v in values
    ):
        raise ValueError(f"{name} must be a non-empty list of positive integers, got {values!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} has repeated values: {values!r}")
    return sorted(int(v) for v in values)


def _check_count(value: int, name: str, minimum: int = 1) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


#: A seed, an integer or a list of integers (``SeedSequence`` entropy).
Seed = int | Sequence[int]


def child_seed(seed: Seed, *keys: int) -> list[int]:
    """``seed`` extended by ``keys``: the entropy of an independent stream per key."""
    return [*([seed] if isinstance(seed, (int, np.integer)) else seed), *keys]


def pair_rngs(
    seed: Seed, n_pairs: int
) -> Iterator[tuple[int, np.random.Generator, np.random.Generator]]:
    """``(pair, rng_run_1, rng_run_2)``: two independent generators per pair, from
    the children ``2 pair`` and ``2 pair + 1`` of ``SeedSequence(seed)``."""
    _check_count(n_pairs, "n_pairs")
    children = np.random.SeedSequence(seed).spawn(2 * n_pairs)
    for pair in range(n_pairs):
        yield (
            pair,
            np.random.default_rng(children[2 * pair]),
            np.random.default_rng(children[2 * pair + 1]),
        )


def model_seed(rng: np.random.Generator) -> int:
    """An integer ``random_state`` for scikit-learn, drawn from a run's generator."""
    return int(rng.integers(2**31 - 1))


FitPredict = Callable[[np.ndarray, np.ndarray, int, int], np.ndarray]


def learning_curve_pairs(
    population: Population,
    fit_predict: FitPredict,
    resources: Sequence[int],
    *,
    n_train: int,
    n_pairs: int,
    seed: Seed,
    loss: str = "squared",
    mu: float = 2.0,
) -> pd.DataFrame:
    r"""Pairs for a family whose class doubles with its resource (trees: depth
    :math:`d \to 2d`, networks: width :math:`n \to 2n`).

    Each run draws its own training sample of ``n_train`` points from ``population``
    and a seed, and fits ``fit_predict(X, y, resource, seed)`` (returning predictions,
    logits for logistic loss, on ``population.X``) at every resource and at twice
    every resource. Per pair and resource :math:`p` the row holds :func:`loss_terms`
    of the two :math:`p`-models (risks of :math:`f_1, f_2, \bar f`, :math:`D`, the
    midpoint bound and, for squared loss, the identity residual) and the
    ``lemma_bound`` terms from the same runs' :math:`2p`-models.

    Parameters
    ----------
    population : Population
        Training distribution and evaluation sample.
    fit_predict : callable
        ``fit_predict(X, y, resource, seed)``: the predictions on ``population.X``.
    resources : sequence of int
        Distinct positive resources :math:`p`, run in sorted order.
    n_train, n_pairs : int
        Training points per run (at least 2) and pairs of runs (at least 1).
    seed : int or sequence of int
        ``SeedSequence`` entropy.
    loss, mu : str, float
        Those of :func:`loss_terms` (defaults ``"squared"``, 2.0).

    Returns
    -------
    pandas.DataFrame
        One row per pair and resource (columns as above, with ``data``, ``resource``,
        ``pair``); ``ValueError`` if ``resources``, ``n_train`` or ``n_pairs`` is invalid.
    """
    resources = check_resources(resources)
    _check_count(n_train, "n_train", 2)
    fitted = sorted(set(resources) | {2 * r for r in resources})
    rows = []
    for pair, rng1, rng2 in pair_rngs(seed, n_pairs):
        preds, risks = [], []
        for rng in (rng1, rng2):
            X, y = population.draw(n_train, rng)
            seed_run = model_seed(rng)
            pred = {r: np.asarray(fit_predict(X, y, r, seed_run), dtype=np.float64) for r in fitted}
            preds.append(pred)
            risks.append(
                {r: float(np.mean(LOSSES[loss](population.y, p))) for r, p in pred.items()}
            )
        for r in resources:
            terms = loss_terms(population.y, preds[0][r], preds[1][r], loss=loss, mu=mu)
            row = {"data": population.name, "resource": r, "pair": pair, **terms}
            if loss == "squared":
                row["identity_residual"] = terms["D"] - terms["midpoint_bound"]
            lemma = lemma_bound(risks[0][r], risks[1][r], risks[0][2 * r], risks[1][2 * r], mu=mu)
            row[risk_column(loss, "g1")] = risks[0][2 * r]
            row[risk_column(loss, "g2")] = risks[1][2 * r]
            row.update({k: float(v) for k, v in lemma.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    r"""Mean and Student-t interval :math:`\bar v \pm t_{(1+\mathrm{level})/2,\,n-1}\, s/\sqrt n`
    over pairs (NaN interval for fewer than two values).

    Parameters
    ----------
    values : sequence of float, length n
        At least one value (else ``ValueError``).
    level : float, default 0.95
        Confidence level, in (0, 1) (else ``ValueError``).

    Returns
    -------
    tuple of float
        ``(mean, lo, hi)``; ``lo``, ``hi`` NaN when n < 2.
    """
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = float(v.mean())
    if v.size < 2:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf((1 + level) / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))
    return mean, mean - half, mean + half


def summarize(
    pairs: pd.DataFrame,
    *,
    by: Sequence[str] = ("data", "resource"),
    bounds: Sequence[str] = ("bound",),
    level: float = 0.95,
) -> pd.DataFrame:
    """Per group: ``n_pairs``, mean ``D`` with its interval (``D_lo``, ``D_hi``), the
    mean of each bound column with its interval, ``pairs_below_D`` (pairs whose first
    bound is below their ``D``) and the failure flags of the first bound:
    ``bound_negative`` (its mean is below zero) and ``bound_below_D`` (its mean is
    below mean ``D``); ``failure`` is either. ``identity_max`` is the largest
    ``abs(identity_residual)`` when the pairs carry one.

    Parameters
    ----------
    pairs : pandas.DataFrame
        With the columns ``by``, ``D`` and ``bounds`` (else ``ValueError``).
    by : sequence of str, default ("data", "resource")
        The columns to group by.
    bounds : sequence of str, default ("bound",)
        Bound columns; the first is flagged.
    level : float, default 0.95
        Of the intervals (:func:`mean_ci`).

    Returns
    -------
    pandas.DataFrame
        One row per group, sorted by ``by``.
    """
    missing = [c for c in (*by, "D", *bounds) if c not in pairs.columns]
    if missing:
        raise ValueError(f"pairs lacks columns {missing}")
    rows = []
    for key, group in pairs.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        row["n_pairs"] = len(group)
        row["D_mean"], row["D_lo"], row["D_hi"] = mean_ci(group["D"], level)
        for b in bounds:
            row[f"{b}_mean"], row[f"{b}_lo"], row[f"{b}_hi"] = mean_ci(group[b], level)
        first = bounds[0]
        row["pairs_below_D"] = int((group[first] < group["D"]).sum())
        if "identity_residual" in group:
            row["identity_max"] = float(group["identity_residual"].abs().max())
        row["bound_negative"] = bool(row[f"{first}_mean"] < 0)
        row["bound_below_D"] = bool(row[f"{first}_mean"] < row["D_mean"])
        row["failure"] = row["bound_negative"] or row["bound_below_D"]
        rows.append(row)
    return pd.DataFrame(rows)


def lemma_summary(pairs: pd.DataFrame) -> pd.DataFrame:
    """:func:`summarize` of a learning-curve family (trees, networks): the plug-in
    lemma bound (its flags) and its anchor form."""
    return summarize(pairs, bounds=("bound", "bound_anchor"))


def loglog_slope(x: Sequence[float], y: Sequence[float], level: float = 0.95) -> dict[str, float]:
    r"""Least-squares slope of :math:`\log y` on :math:`\log x` with a t interval
    (``scipy.stats.linregress``); ``y`` must be positive."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.size < 3 or np.any(x <= 0) or np.any(y <= 0):
        raise ValueError("loglog_slope needs >= 3 positive (x, y) pairs of one shape")
    fit = stats.linregress(np.log(x), np.log(y))
    half = float(stats.t.ppf((1 + level) / 2, x.size - 2) * fit.stderr)
    return {
        "slope": float(fit.slope),
        "slope_lo": float(fit.slope - half),
        "slope_hi": float(fit.slope + half),
    }


def logistic_mu(bound: float) -> float:
    r"""Strong convexity of the logistic loss on logits in :math:`[-B, B]`:
    :math:`\min_{|f| \le B} \sigma(f)(1 - \sigma(f)) = \sigma(B)(1 - \sigma(B))`."""
    if not bound > 0:
        raise ValueError(f"logit bound must be positive, got {bound}")
    s = float(special.expit(bound))
    return s * (1.0 - s)
