r"""Differentially private client KD: the Gaussian mechanism on a bounded kernel.

Each client i releases, for every model it scores, its KD estimate plus Gaussian
noise, :math:`\widetilde{\mathrm{KD}}_i(G) = \mathrm{KD}(X_i, Y_G) + \mathcal N(0, \sigma_i^2)`;
the server averages the noisy values only. The neighbouring relation is the
replacement of one of the client's n_i reference rows (n_i is public, and so are
the models' samples Y and the kernel, bandwidth included: a bandwidth computed on
the client's rows would be a release of its own).

**Sensitivity.** For a kernel with :math:`0 \le k \le 1` and :math:`k(x, x) = 1`
(``rbf`` and ``laplace``), replacing row :math:`x_1` by :math:`x_1'` changes the
estimate by

.. math::
    \Delta = \frac{2}{n} \Big( \tfrac{1}{c} \sum_{b \ge 2} [k(x_1, x_b) - k(x_1', x_b)]
        - \tfrac{1}{m} \sum_j [k(x_1, y_j) - k(x_1', y_j)] \Big),
    \qquad c = n - 1 \text{ (U) or } n \text{ (V)},

since the model's own term does not involve X and the diagonal terms
:math:`k(x_1, x_1) = k(x_1', x_1') = 1` cancel (V). The first average lies in
:math:`[-(n-1)/c, (n-1)/c]`, the second in :math:`[-1, 1]`, so

.. math::
    |\Delta| \le \Delta_U = \frac{4}{n}, \qquad
    |\Delta| \le \Delta_V = \frac{2}{n}\Big(\frac{n-1}{n} + 1\Big) = \frac{2(2n-1)}{n^2},

whatever m and the model. Both bounds are suprema: they are approached by
:math:`x_2 = \dots = x_n = x_1`, every :math:`y_j = x_1'` and
:math:`|x_1 - x_1'| \to \infty` (the averages tend to +1 and -1).

**Noise and budget** are those of ``distrank.metrics._privacy``: a client's
(epsilon, delta) is split equally over its M releases (one per model,
``client_budget``).

**Distributed noise (secure mode).** When the server learns only the sum
:math:`S = \sum_i n_i \mathrm{KD}_i` (``distrank.flower.secure``), the release is
:math:`\mathrm{KD}_{avg} = S / n`, whose sensitivity to one row is
:math:`\lambda_i \Delta_i = 4 / n` (U; below it for V): :math:`n_i \Delta_i \le 4 =`
:data:`SUM_SENSITIVITY` whatever the site, and n does not change when a row is
replaced. One Gaussian mechanism of std :math:`\sigma = 4 z` on S, z as above for
M models, is split over the sites (:class:`DistributedNoise`): the released noise
std is :math:`4 z \sqrt{A/t} / n` against :math:`4 z \sqrt{k} / n` when each of
k sites releases its own noisy KD (:func:`private_scores`; the lambda-weighted
stds :math:`\lambda_i 4 z / n_i` are all :math:`4 z / n`), i.e.
:math:`\sqrt{k t / A}` times less noise for the same budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from distrank._checks import positive_int
from distrank.metrics._metric import BANDWIDTH_KERNELS, check_full_sample
from distrank.metrics._options import ScoreOptions, score_options
from distrank.metrics._privacy import PrivacyBudget, client_budget

if TYPE_CHECKING:  # scoring (torch) and pandas load where they are used
    import pandas as pd

#: Kernels with 0 <= k <= 1 and k(x, x) = 1, for which the sensitivity above holds.
BOUNDED_KERNELS = BANDWIDTH_KERNELS


def kd_sensitivity(n_rows: int, *, estimator: str = "unbiased") -> float:
    """Largest change of a client's KD from replacing one of its ``n_rows`` rows.

    ``4 / n`` for the U-statistic (``"unbiased"``, n >= 2) and ``2 (2n - 1) / n^2``
    for the V-statistic (``"biased"``), for a bounded kernel (module doc).

    Parameters
    ----------
    n_rows
        the client's rows n: an int, at least 2 for ``"unbiased"``, 1 for ``"biased"``.
    estimator
        ``"unbiased"`` (default) or ``"biased"``.

    Returns
    -------
    float
        The sensitivity Delta; a ValueError names a bad ``n_rows`` or ``estimator``.
    """
    check_full_sample(estimator, "estimator")
    n = positive_int(n_rows, "n_rows", minimum=2 if estimator == "unbiased" else 1)
    return 4.0 / n if estimator == "unbiased" else 2.0 * (2 * n - 1) / n**2


def release_kd(
    kd_client,
    client_sizes,
    *,
    budget: PrivacyBudget,
    estimator: str = "unbiased",
    rng: np.random.Generator,
) -> np.ndarray:
    """Each client's KD of each model plus its Gaussian noise: what the clients release.

    Client i adds independent N(0, sigma_i^2) noise, sigma_i =
    ``budget.noise_multiplier`` x ``kd_sensitivity(n_i)``, to each of its M values.

    Parameters
    ----------
    kd_client
        (M, k) array of KD per (model, client), or (draws, M, k).
    client_sizes
        (k,) each client's rows n_i.
    budget
        each client's ``PrivacyBudget``, split over its M releases (one per model):
        ``budget.n_releases`` must be M.
    estimator
        ``"unbiased"`` (default) or ``"biased"``: the estimator of ``kd_client``, which
        sets the sensitivity (:func:`~distrank.metrics.kd.kd_sensitivity`).
    rng
        ``numpy.random.Generator`` of the noise.

    Returns
    -------
    numpy.ndarray
        float64, the shape of ``kd_client``: the noisy values. A ValueError names a
        wrong shape or a budget split over another number of releases.
    """
    values = np.asarray(kd_client, dtype=np.float64)
    if values.ndim not in (2, 3):
        raise ValueError(
            f"kd_client: expected an (M, k) or (draws, M, k) array, got shape {values.shape}"
        )
    sizes = np.asarray(client_sizes)
    if sizes.shape != (values.shape[-1],):
        raise ValueError(
            f"client_sizes: expected {values.shape[-1]} sizes (one per client), "
            f"got shape {sizes.shape}"
        )
    if budget.n_releases != values.shape[-2]:
        raise ValueError(
            f"budget: split over {budget.n_releases} releases, but each client "
            f"releases {values.shape[-2]} values (one per model)"
        )
    std = client_noise_stds(sizes, budget=budget, estimator=estimator)
    return values + rng.standard_normal(values.shape) * std


def client_noise_stds(client_sizes, *, budget: PrivacyBudget, estimator: str = "unbiased"):
    """(k,) sigma_i of each client's releases (:func:`release_kd`): ``budget``'s noise
    multiplier times ``kd_sensitivity(n_i)``."""
    return np.array(
        [budget.noise_std(kd_sensitivity(int(n), estimator=estimator)) for n in client_sizes]
    )


def avg_noise_std(
    client_sizes, weights, *, budget: PrivacyBudget, estimator: str = "unbiased"
) -> float:
    """The noise std of every model's released ``avg``, sum_i w_i (KD_i + e_i) with e_i ~
    N(0, sigma_i^2) (:func:`client_noise_stds`): sqrt(sum_i w_i^2 sigma_i^2), the same for
    every model and independent across models (each release is its own draw); 4 z sqrt(k)
    / n (U-statistic) under the weights n_i / n (module doc)."""
    stds = client_noise_stds(client_sizes, budget=budget, estimator=estimator)
    return float(np.sqrt(np.sum((np.asarray(weights, np.float64) * stds) ** 2)))


def check_private_options(opts: ScoreOptions) -> None:
    """ValueError naming the option unless these options release KD privately: metrics
    ``("kd",)``, a bounded kernel (``rbf``/``laplace``) with an explicit bandwidth
    chosen without the clients' rows, and a full-sample estimator."""
    if opts.metrics != ("kd",):
        raise ValueError(f"metrics: private scores release KD only, got {opts.metrics!r}")
    if opts.kernel not in BOUNDED_KERNELS:
        raise ValueError(
            f"kernel: private KD needs a kernel bounded in [0, 1] with "
            f"k(x, x) = 1, one of {BOUNDED_KERNELS}; got {opts.kernel!r}"
        )
    if "bandwidth" not in (opts.kernel_params or {}):
        raise ValueError(
            "kernel_params: private KD needs an explicit 'bandwidth' fixed "
            "without the clients' rows (a median on them would be a release)"
        )
    check_full_sample(opts.kd_estimator, why=" (private KD is a full-sample estimate)")


#: The largest change of n_i KD_i, site i's term of sum_i n_i KD_i, from replacing one
#: of its rows: n kd_sensitivity(n) = 4 (U-statistic), 2 (2n - 1) / n < 4 (V-statistic).
SUM_SENSITIVITY = 4.0


@dataclass(frozen=True)
class DistributedNoise:
    """Secure mode's noise: of one Gaussian mechanism on sum_i n_i KD_i, split over sites.

    Each site adds N(0, sigma^2 / t) to its n_i KD_i of every model, t the number of
    sites that unmasking needs, so any sum that can be unmasked (over A >= t sites)
    carries noise of variance (A / t) sigma^2 >= sigma^2, sigma =
    ``budget.noise_multiplier`` x :data:`SUM_SENSITIVITY` with the budget split over
    the M models (module doc).
    """

    budget: PrivacyBudget
    threshold: int
    sensitivity: float = SUM_SENSITIVITY  # of one release (2 for a sketch sum n_i s_i)

    @property
    def sum_std(self) -> float:
        """The noise std (sigma) of a sum over ``threshold`` sites."""
        return self.budget.noise_std(self.sensitivity)

    @property
    def site_std(self) -> float:
        """The std of each site's noise, sigma / sqrt(t)."""
        return self.sum_std / math.sqrt(self.threshold)

    def released_std(self, n_rows: int, n_sites: int) -> float:
        """The noise std of KD_avg = (sum + noise) / n over ``n_sites`` sites of
        ``n_rows`` rows in all: sigma sqrt(n_sites / t) / n."""
        if n_sites < self.threshold:
            raise ValueError(f"n_sites: a sum needs {self.threshold} sites, got {n_sites}")
        return self.sum_std * math.sqrt(n_sites / self.threshold) / n_rows


def distributed_noise(
    *,
    epsilon: float,
    delta: float,
    n_models: int,
    threshold: int,
    sensitivity: float = SUM_SENSITIVITY,
) -> DistributedNoise:
    """The noise that makes the released KD_avg of ``n_models`` models (epsilon, delta)-DP
    (each model's sum of sensitivity ``sensitivity``; a pooled sketch is one release of
    sensitivity 2, ``metrics.sketch``)."""
    threshold = positive_int(threshold, "threshold", minimum=2)
    budget = client_budget(epsilon=epsilon, delta=delta, n_releases=n_models)
    return DistributedNoise(budget, threshold, float(sensitivity))


#: the options of :func:`private_scores` when none are given: KD through the rbf kernel
PRIVATE_OPTIONS = ScoreOptions(metrics=("kd",), kernel="rbf")


def private_scores(
    reference,
    clients,
    models: Mapping[str, object],
    options: ScoreOptions | Mapping | None = None,
    *,
    epsilon: float,
    delta: float,
    device=None,
    **changes,
) -> tuple[pd.DataFrame, PrivacyBudget]:
    """KD of every model as private clients release it, and each client's budget.

    Every client releases its KD of each model through
    :func:`~distrank.metrics.kd.release_kd` with (``epsilon``, ``delta``) split over the
    models; ``avg`` is the weighted mean of the noisy client values, the only aggregate
    the server can form.

    Parameters
    ----------
    reference
        (n, d) numpy or torch array of reference features.
    clients
        (n,) client label (int or str) of each reference row.
    models
        model name -> (m, d) array of generated features.
    options
        those of :func:`~distrank.metrics.score` (a
        :class:`~distrank.metrics.ScoreOptions` or a mapping of them; None:
        ``PRIVATE_OPTIONS``, KD through the rbf kernel). ``metrics`` must be
        ``("kd",)``, ``kd_estimator`` a full-sample one and ``kernel`` bounded
        (``rbf``/``laplace``) with an explicit ``kernel_params["bandwidth"]`` chosen
        without the clients' rows. Noise comes from ``numpy.random.default_rng(seed)``.
    epsilon, delta
        each client's (epsilon, delta), split equally over its M releases (one per model).
    device
        torch device (``None``: CUDA if available, else CPU).
    **changes
        option names as keywords, overriding ``options`` (as for
        :func:`~distrank.metrics.score`).

    Returns
    -------
    tuple of (pandas.DataFrame, PrivacyBudget)
        The table, with the columns of :func:`~distrank.metrics.score` (metric ``kd``,
        aggregations ``client`` and ``avg``; no ``all``, which needs the pooled rows);
        its ``attrs`` hold the noise std of each client's releases
        (``client_noise_std``: client -> sigma_i) and of every model's ``avg``
        (``avg_noise_std``, from the function of that name). Then each client's budget.
        A bad input or option is a ValueError naming it.
    """
    from distrank.metrics._scoring import prepare, values_of
    from distrank.metrics._table import from_values

    opts = score_options(PRIVATE_OPTIONS if options is None else options, **changes)
    check_private_options(opts)
    inputs = prepare(reference, clients, models, opts, device=device)
    groups = inputs.groups
    exact = np.stack([values["kd"][1] for values in values_of(inputs).values()])
    budget = client_budget(epsilon=epsilon, delta=delta, n_releases=len(inputs.models))
    noisy = release_kd(
        exact,
        groups.sizes,
        budget=budget,
        estimator=opts.kd_estimator,
        rng=np.random.default_rng(opts.seed),
    )
    weights = groups.weights(opts.weights)
    table = from_values(
        {model: {"kd": (None, noisy[g])} for g, model in enumerate(inputs.models)},
        groups.names,
        weights,
    )
    # the noise each release carries: metrics.sketch._confidence.private_confidence
    stds = client_noise_stds(groups.sizes, budget=budget, estimator=opts.kd_estimator)
    table.attrs["client_noise_std"] = dict(zip(groups.names, stds.tolist()))
    table.attrs["avg_noise_std"] = avg_noise_std(
        groups.sizes, weights, budget=budget, estimator=opts.kd_estimator
    )
    return table, budget
