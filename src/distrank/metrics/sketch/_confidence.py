r"""How far the noise of private sketches lets a ranking be trusted, and planned.

A pooled sketch released with Gaussian noise is :math:`\tilde s = s + \eta`,
:math:`\eta \sim \mathcal N(0, \sigma^2 I_D)` (:mod:`distrank.metrics.sketch`), and
every model's value is :math:`\widehat{\mathrm{KD}}(\tilde s, t_G)`. Two consequences
follow exactly:

- **The bias.** :math:`\mathbb E\,\frac{n\|\tilde s\|^2 - 1}{n - 1} = \frac{n\|s\|^2 - 1}
  {n - 1} + \frac{n}{n - 1} D \sigma^2`: the same for every model. :func:`unbiased`
  removes it; the raw value stays in the table's metadata.
- **The gap.** The gap of two models is :math:`\widehat{\mathrm{KD}}_a -
  \widehat{\mathrm{KD}}_b = c_{ab} - 2\,\tilde s \cdot (t_a - t_b)`, :math:`c_{ab}` free of
  the noise, so its noise is :math:`\mathcal N(0, 4 \sigma^2 \|t_a - t_b\|^2)`
  (:func:`gap_std`), and the adjacent gaps of an order are jointly Gaussian with
  covariance :math:`4 \sigma^2 (t_a - t_b) \cdot (t_c - t_d)`.

Both are cases of one form, which the functions below take: every model's value carries
noise :math:`L_m \cdot \xi`, :math:`\xi \sim \mathcal N(0, I)`, for *loadings*
:math:`L_m` (:func:`sketch_loadings`: :math:`L_m = 2 \sigma t_m`), so a gap's noise std is
:math:`|L_a - L_b|` and adjacent gaps have covariance :math:`(L_b - L_a) \cdot (L_d - L_c)`.
``distrank score --private`` is the other case (:func:`private_confidence`): each client
releases its KD of each model with its own independent noise :math:`\mathcal N(0,
\sigma_i^2)` (:func:`distrank.metrics.kd.release_kd`), so model a's ``avg``
carries :math:`\mathcal N(0, s_a^2)`, :math:`s_a^2 = \sum_i w_i^2 \sigma_i^2`
(``avg_noise_std``), independent across models
(:func:`independent_loadings`: :math:`L_m = s_m e_m`), and a gap's noise std is
:math:`\sqrt{s_a^2 + s_b^2}`.

From an observed gap g of noise std :math:`\tau`, :func:`pair_confidence` gives
:math:`\Phi(|g| / \tau)`: the probability, under a flat prior on the noiseless gap,
that the noiseless sketch orders the pair as the noisy one does; the pair is
*resolved* at level :math:`\ell` when that is at least :math:`\ell` (:math:`|g| \ge
z_\ell \tau`: the interval :math:`g \pm z_\ell \tau` excludes 0, and it covers the
noiseless gap with probability :math:`2\ell - 1` over the noise, E11's calibration).
The whole order's probability is that of every adjacent gap keeping its sign under the
joint law (a Monte Carlo estimate, :func:`order_confidence`).

The map's own error (D finite) is not noise: the sketched kernel is a kernel, so its KD
ranks by Theorem 1 like any other; it differs from the exact rbf KD by the map's
approximation, which E11 measures (the relative error at each D) and which shrinks as
:math:`1/\sqrt{D}`. The ranking reported is the sketched kernel's.

**Planning** (:func:`plan`): before any site spends budget, everything above but the
observed gaps is public -- the models' sketches :math:`t_G` (from their samples and the
public map) and :math:`\sigma` (from :math:`\varepsilon, \delta`, the sites' sizes, and
the path): plain sketches give :math:`\sigma = 2 z \sqrt{k} / n` (each site adds
:math:`N(0, (2z/n_i)^2)` to its mean, i.e. :math:`2z` to :math:`n_i s_i`), a secure sum
:math:`\sigma = 2 z \sqrt{A/t} / n` at the least (the honest sites' noise), with
:math:`z = z_1(\varepsilon, \delta)` the Gaussian mechanism's multiplier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

from distrank.metrics.sketch._maps import bias

#: the level at which a pair is called resolved unless the caller says otherwise
LEVEL = 0.95
#: draws of the whole order's Monte Carlo estimate (its standard error <= 0.0016)
ORDER_DRAWS = 100_000


def unbiased(raw: float, n: int, dim: int, noise_std: float) -> float:
    """A noisy sketch's KD with its expected excess removed."""
    return raw - bias(n, dim, noise_std)


def gap_std(noise_std: float, t_a: np.ndarray, t_b: np.ndarray) -> float:
    """The noise std of the KD gap of two models: ``2 sigma |t_a - t_b|``."""
    return 2.0 * noise_std * float(np.linalg.norm(np.asarray(t_a) - np.asarray(t_b)))


def sketch_loadings(sketches: Mapping[str, np.ndarray], noise_std: float) -> dict:
    """model -> ``2 sigma t_m``: a noisy sketch's noise on the models' values (module doc;
    the gap of a and b then has noise std :func:`gap_std`)."""
    return {m: 2.0 * noise_std * np.asarray(t, np.float64) for m, t in sketches.items()}


def independent_loadings(stds: Mapping[str, float]) -> dict:
    """model -> ``s_m e_m``: independent N(0, s_m^2) noise on each model's value (a gap's
    noise std is then ``sqrt(s_a^2 + s_b^2)``)."""
    eye = np.eye(len(stds))
    return {m: float(s) * eye[i] for i, (m, s) in enumerate(stds.items())}


def pair_confidence(gap: float, std: float) -> float:
    """``Phi(|gap| / std)``: the probability that the noiseless order of the pair is the
    observed one (1 without noise)."""
    return 1.0 if std == 0 else float(ndtr(abs(gap) / std))


def z_of(level: float) -> float:
    """The gap in noise stds at which a pair is resolved at ``level`` (in (0.5, 1))."""
    if not 0.5 < level < 1:
        raise ValueError(f"level: expected a number in (0.5, 1), got {level!r}")
    return float(ndtri(level))


def _adjacent(values: Mapping[str, float]) -> list[tuple[str, str]]:
    """The adjacent pairs (a, b) of the order of ``values``, lowest (best KD) first."""
    order = sorted(values, key=lambda m: values[m])
    return list(zip(order, order[1:]))


def confidence_table(
    values: Mapping[str, float], loadings: Mapping[str, np.ndarray], *, level: float = LEVEL
) -> pd.DataFrame:
    """Per adjacent pair of the observed order (lowest KD first): ``rank``, ``model``,
    ``next`` (the model ranked after it), ``gap`` (>= 0, in the metric's units),
    ``noise_std`` of the gap, ``p_order`` (:func:`pair_confidence`) and ``resolved`` (at
    ``level``).

    ``values``: model -> observed value; ``loadings``: model -> the loadings of its
    value's noise (module doc: :func:`sketch_loadings`, :func:`independent_loadings`).
    """
    z, rows = z_of(level), []
    for i, (a, b) in enumerate(_adjacent(values), 1):
        gap = values[b] - values[a]
        std = float(np.linalg.norm(np.asarray(loadings[b]) - np.asarray(loadings[a])))
        rows.append((i, a, b, gap, std, pair_confidence(gap, std), bool(gap >= z * std)))
    columns = ["rank", "model", "next", "gap", "noise_std", "p_order", "resolved"]
    return pd.DataFrame(rows, columns=columns)


def order_confidence(
    values: Mapping[str, float],
    loadings: Mapping[str, np.ndarray],
    *,
    draws: int = ORDER_DRAWS,
    seed: int = 0,
) -> float:
    """The probability that the noiseless values order every model as observed: each
    adjacent gap g_i keeps its sign when its noise e (jointly N(0, C), C_ij = (L_b - L_a)
    . (L_d - L_c) for the ``loadings`` L, module doc) is taken off. A Monte Carlo
    estimate of ``draws`` draws (seeded: the same inputs give the same number)."""
    pairs = _adjacent(values)
    diffs = np.array([np.asarray(loadings[b]) - np.asarray(loadings[a]) for a, b in pairs])
    if not pairs or not diffs.any():
        return 1.0
    cov = diffs @ diffs.T
    gaps = np.array([values[b] - values[a] for a, b in pairs])
    noise = np.random.default_rng(seed).multivariate_normal(
        np.zeros(len(gaps)), cov, size=draws, method="eigh"
    )
    return float(np.mean(np.all(gaps - noise > 0, axis=1)))


def table_confidence(
    table: pd.DataFrame, metric: str, loadings: Mapping[str, np.ndarray], level: float = LEVEL
) -> dict:
    """The confidence of the ``all`` and ``avg`` rankings (those the table has) of
    ``metric``: ``metric``, ``pairs`` (:func:`confidence_table` of each, with columns
    ``aggregation`` and ``level``), ``order`` (aggregation -> :func:`order_confidence`) and
    ``level``."""
    parts, order = [], {}
    for agg in sorted({"all", "avg"} & set(table.aggregation)):
        rows = table[(table.aggregation == agg) & (table.metric == metric)]
        values = dict(zip(rows.model, rows.value))
        pairs = confidence_table(values, loadings, level=level)
        parts.append(pairs.assign(aggregation=agg, level=level))
        order[agg] = order_confidence(values, loadings)
    pairs = pd.concat(parts, ignore_index=True)
    return {"metric": metric, "pairs": pairs, "order": order, "level": level}


def ranking_confidence(
    pooled, model_sketches: Mapping[str, np.ndarray], table: pd.DataFrame, level: float = LEVEL
) -> dict:
    """``table_confidence`` of a ``kd_sketch`` table: which of its rankings' pairs hold.

    Every model's value carries the pooled sketch's noise through the loadings
    ``2 sigma t_m`` (``sketch_loadings``; module doc).

    Parameters
    ----------
    pooled
        the pooled reference :class:`~distrank.metrics.sketch.Sketch` (its
        ``noise_std`` sigma is that of ``avg`` too: sum_i lambda_i eta_i is the pooled
        noise).
    model_sketches
        model name -> (D,) every model's mean sketch t.
    table
        a ``kd_sketch`` score table (columns model, metric, aggregation, value); its
        ``all`` and ``avg`` rankings, those it has, are assessed.
    level
        in (0.5, 1): a pair is resolved when its p_order is at least ``level`` (default
        ``LEVEL``, 0.95).

    Returns
    -------
    dict
        ``metric`` (``"kd_sketch"``), ``pairs`` (pandas.DataFrame, per adjacent pair of
        each ranking: rank, model, next, gap, noise_std, p_order, resolved, aggregation,
        level), ``order`` (aggregation -> the Monte Carlo probability that the
        noiseless values keep the whole order) and ``level``.
    """
    loadings = sketch_loadings(model_sketches, pooled.noise_std)
    return table_confidence(table, "kd_sketch", loadings, level)


def private_confidence(table: pd.DataFrame, noise_std: float, level: float = LEVEL) -> dict:
    """:func:`table_confidence` of a ``distrank.metrics.kd._privacy.private_scores`` table
    (its ``avg`` ranking of ``kd``): every model's ``avg`` carries independent N(0, s^2)
    noise, s = ``noise_std`` (``avg_noise_std``)."""
    models = dict.fromkeys(table.model[(table.metric == "kd") & (table.aggregation == "avg")])
    return table_confidence(
        table, "kd", independent_loadings(dict.fromkeys(models, noise_std)), level
    )


def score_sketches(sites: Mapping, models: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """The tidy score table of ``kd_sketch`` (KD of the sketched rbf kernel) of every model
    against each site's sketch (``client``; site name -> ``metrics.sketch._maps.Sketch``), their
    size-weighted average (``avg``) and the pooled sketch (``all``); the map comes from
    the sketches' metadata, which must agree. Values unbiased (:func:`sketch_scores`)."""
    from distrank.metrics.sketch._maps import FeatureMap, pool

    fmap = FeatureMap.of(pool(list(sites.values())).meta)  # pool: the maps agree
    return sketch_scores(sites, {name: fmap.sketch(y) for name, y in models.items()})[0]


def sketch_scores(sites: Mapping, model_sketches: Mapping) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the table of :func:`score_sketches` from the models' sketches, the same table raw).
    A noisy sketch's values are unbiased: the expected excess n / (n - 1) D sigma^2 of its
    noise is removed (``metrics.sketch._maps.bias``; the same for every model)."""
    from distrank.clients import client_weights
    from distrank.metrics._table import from_values
    from distrank.metrics.sketch._maps import bias, pool, sketch_kd

    pooled = pool(list(sites.values()))
    references = [pooled, *sites.values()]
    excess = [bias(s.n, pooled.meta["dim"], s.noise_std) for s in references]
    raw, values = {}, {}
    for name, t in model_sketches.items():
        kd = [sketch_kd(s, t) for s in references]
        raw[name] = {"kd_sketch": (kd[0], kd[1:])}
        fair = [v - e for v, e in zip(kd, excess)]
        values[name] = {"kd_sketch": (fair[0], fair[1:])}
    weights = client_weights([s.n for s in sites.values()], "size")  # n_i / n, as pooled
    return from_values(values, list(sites), weights), from_values(raw, list(sites), weights)


def rank_sketches(sites: Mapping, models: Mapping[str, np.ndarray], level: float = LEVEL):
    """(the ``kd_sketch`` table of ``models`` from the sites' sketches, unbiased
    (:func:`sketch_scores`), its metadata): the options, the map, the
    extractor, every site's privacy, the raw values and :func:`ranking_confidence`
    (``meta["confidence"]``, its pairs as records, which :func:`write_confidence`
    writes beside the table)."""
    from distrank.metrics._options import ScoreOptions
    from distrank.metrics.sketch._maps import FeatureMap, pool

    pooled = pool(list(sites.values()))
    m, first = pooled.meta, next(iter(sites.values())).meta
    fmap = FeatureMap.of(m)
    sketched = {name: fmap.sketch(y) for name, y in models.items()}
    table, raw = sketch_scores(sites, sketched)
    t = {name: s.mean for name, s in sketched.items()}
    conf = ranking_confidence(pooled, t, table, level)
    noisy = sorted(name for name, s in sites.items() if s.noise_std)
    options = ScoreOptions(
        metrics=("kd_sketch",),
        kernel="rbf",
        kernel_params={"bandwidth": m["bandwidth"]},
        seed=int(m["seed"]),
        dtype="float64",
    )
    kept = raw[raw.aggregation != "client"]
    meta = {
        "options": options.as_dict(),
        "extractor": first.get("extractor"),
        "sketch": {
            "map": {
                k: first.get(k)
                for k in (
                    "kernel",
                    "dim",
                    "seed",
                    "bandwidth",
                    "input_dim",
                    "weights",
                    "map_sha256",
                )
            },
            "sites": {
                name: {k: s.meta.get(k) for k in ("epsilon", "delta", "noise_std")} | {"n": s.n}
                for name, s in sites.items()
            },
            "noise": "none"
            if not noisy
            else ("every site" if len(noisy) == len(sites) else f"sites {noisy} only"),
            "pooled_noise_std": pooled.noise_std,
            "bias_removed": bias(pooled.n, m["dim"], pooled.noise_std),
            "raw": [
                {"model": r.model, "aggregation": r.aggregation, "value": r.value}
                for r in kept.itertuples()
            ],
            "note": "values are unbiased: the expected excess n / (n - 1) D sigma^2 of each "
            "noisy sketch is removed (the same for every model); raw holds them before. A "
            "noisy sketch moves each model's value by -2 eta . t, which differs between "
            "models: the confidence says which pairs that can reorder.",
        },
        "confidence": conf | {"pairs": conf["pairs"].to_dict(orient="records")},
    }
    return table, meta


def confidence_path(out):
    """Where the pairs go beside a table: ``scores.csv`` -> ``scores.confidence.csv``."""
    from pathlib import Path

    out = Path(out)
    return out.with_name(f"{out.stem}.confidence.csv")


def write_confidence(meta: Mapping, out) -> None:
    """The confidence pairs of ``meta`` (:func:`rank_sketches`) as CSV beside ``out``."""
    from distrank._io import atomic_path

    with atomic_path(confidence_path(out)) as tmp:
        pd.DataFrame(meta["confidence"]["pairs"]).to_csv(tmp, index=False)


def released_std(
    sizes: Sequence[int], *, epsilon: float, delta: float, secure: bool = False, threshold: int = 0
) -> float:
    """The per-entry noise std of the pooled sketch of sites of ``sizes`` rows, each of
    (``epsilon``, ``delta``): plain sketches 2 z sqrt(k) / n; a secure sum 2 z sqrt(k / t)
    / n over the k sites, t the threshold (module doc)."""
    from distrank.metrics._privacy import noise_multiplier

    z = noise_multiplier(epsilon=epsilon, delta=delta)
    k, n = len(sizes), sum(int(s) for s in sizes)
    share = k / threshold if secure else k
    return 2.0 * z * math.sqrt(share) / n


def plan(
    sketches: Mapping[str, np.ndarray],
    sizes: Sequence[int],
    *,
    epsilon: float,
    delta: float,
    level: float = LEVEL,
    secure: bool = False,
    threshold: int = 0,
    target_gap: float | None = None,
) -> pd.DataFrame:
    """Before spending: for every pair of models (from their public sketches), the
    distance of their sketches, the noise std of their KD gap and the smallest gap
    resolved at ``level``; with ``target_gap``, what would resolve that gap at ``level``:
    the epsilon (at ``delta``, the same sites) and the rows per site (the same epsilon, k
    sites of equal size). Sorted hardest pair first."""
    from distrank.metrics._privacy import epsilon_spent, noise_multiplier

    sigma = released_std(sizes, epsilon=epsilon, delta=delta, secure=secure, threshold=threshold)
    z_level, k, n = z_of(level), len(sizes), sum(int(s) for s in sizes)
    root_share = math.sqrt(k / threshold if secure else k)
    z = noise_multiplier(epsilon=epsilon, delta=delta)
    names, rows = list(sketches), []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            diff = float(np.linalg.norm(np.asarray(sketches[a]) - np.asarray(sketches[b])))
            row = {"model": a, "other": b, "sketch_distance": diff}
            row |= {
                "gap_noise_std": 2.0 * sigma * diff,
                "smallest_resolved_gap": z_level * 2 * sigma * diff,
            }
            if target_gap is not None:
                # resolved when z_level * 2 * (2 z' root_share / n') * diff <= target_gap
                need = 4.0 * z_level * root_share * diff / target_gap  # = z' / n'
                z_new = n / need if diff else math.inf
                row["epsilon_for_target"] = (
                    epsilon_spent(noise_multiplier=z_new, n_releases=1, delta=delta)
                    if math.isfinite(z_new)
                    else 0.0
                )
                row["rows_per_site_for_target"] = math.ceil(z * need / k)
            rows.append(row)
    return pd.DataFrame(rows).sort_values("gap_noise_std", ascending=False, ignore_index=True)
