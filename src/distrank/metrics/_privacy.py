r"""The Gaussian mechanism: a release's noise from its budget, and the budget it spent.

A release's neighbouring relation and sensitivity are its own (a client's KD:
:mod:`distrank.metrics.kd`; a site's mean sketch: :mod:`distrank.metrics.sketch`);
what they share is the calibration below.

**Noise and budget.** A release with std :math:`\sigma` of a value of sensitivity
:math:`\Delta` is :math:`(\varepsilon, \delta)`-DP iff (Balle and Wang, "Improving the
Gaussian Mechanism for Differential Privacy: Analytical Calibration and Optimal
Denoising", ICML 2018, Theorem 8)

.. math::
    \Phi\Big(\frac{\Delta}{2\sigma} - \frac{\varepsilon\sigma}{\Delta}\Big)
    - e^{\varepsilon} \Phi\Big(-\frac{\Delta}{2\sigma} - \frac{\varepsilon\sigma}{\Delta}\Big)
    \le \delta,

i.e. it is :math:`\mu`-GDP with :math:`\mu = \Delta / \sigma` (Dong, Roth and Su,
"Gaussian Differential Privacy", JRSS-B 2022). A client that scores M models
releases M such values of its own rows; their composition is exactly
:math:`\sqrt{M}\,\mu`-GDP (ibid., Corollary 3.3). A client's budget
:math:`(\varepsilon, \delta)` is therefore split equally over its releases by giving
each the noise multiplier :math:`z = \sigma / \Delta = \sqrt{M}\, z_1(\varepsilon, \delta)`,
with :math:`z_1` the single-release calibration above (``dp_accounting``'s
``get_sigma_gaussian``, a root find of the condition). The budget spent is accounted
by the same identity read backwards: the M releases are one Gaussian mechanism of
noise multiplier :math:`z / \sqrt{M}`, whose exact epsilon at delta is
``dp_accounting``'s ``get_epsilon_gaussian``. Both are closed forms plus a 1-d root
find, so they cost microseconds and constant memory at every epsilon in
:data:`EPSILON_RANGE` (the privacy-loss-distribution accountant, which the tests
use as a cross-check at moderate epsilon, discretises a range that grows with
epsilon). Clients hold disjoint rows, so each client's guarantee is its own
(parallel composition).

"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from distrank._checks import EPSILON_RANGE, positive_int


@dataclass(frozen=True)
class PrivacyBudget:
    """One client's budget, split over its releases (one per model it scores).

    Attributes
    ----------
    epsilon, delta
        the client's (epsilon, delta) for all its releases together.
    n_releases
        M, the releases the budget is split over.
    noise_multiplier
        sigma / sensitivity of every release.
    epsilon_spent
        the exact epsilon of the composed releases at ``delta`` (equal to ``epsilon``
        up to the root finds' tolerance, ~1e-12 relative).
    """

    epsilon: float
    delta: float
    n_releases: int
    noise_multiplier: float
    epsilon_spent: float

    def noise_std(self, sensitivity: float) -> float:
        """sigma of a release of the given sensitivity."""
        return self.noise_multiplier * sensitivity


def noise_multiplier(*, epsilon: float, delta: float, n_releases: int = 1) -> float:
    r"""sigma / Delta of each of ``n_releases`` Gaussian releases composing to (epsilon, delta).

    :math:`z = \sqrt{M}\, z_1(\varepsilon, \delta)`, :math:`z_1` the analytic
    calibration of Balle and Wang (2018) computed by ``dp_accounting`` (module doc).
    """
    import dp_accounting

    epsilon, delta = _check_epsilon(epsilon), _check_delta(delta)
    n_releases = positive_int(n_releases, "n_releases")
    with _quiet_bracketing():
        # tol bounds sigma's absolute error; at the smallest one the root find stops on
        # its relative tolerance (4e-16) instead, which sigma ~ 1e-5 at epsilon 1e9 needs
        z_1 = dp_accounting.get_sigma_gaussian(epsilon, delta, tol=np.finfo(float).tiny)
    return math.sqrt(n_releases) * z_1


def epsilon_spent(*, noise_multiplier: float, n_releases: int, delta: float) -> float:
    """Epsilon at ``delta`` of ``n_releases`` Gaussian releases with this noise multiplier.

    The composition of M Gaussian releases of noise multiplier z (std / shift) is
    exactly one Gaussian release of multiplier z / sqrt(M) (module doc), whose
    epsilon is ``dp_accounting.get_epsilon_gaussian``. dp-accounting's
    ``GaussianDpEvent(z)`` is the same release (a neighbour shifts it by one unit
    and its std is z units), so its PLD accountant agrees (tests).
    """
    import dp_accounting

    z = _check_positive(noise_multiplier, "noise_multiplier")
    n_releases = positive_int(n_releases, "n_releases")
    delta = _check_delta(delta)
    with _quiet_bracketing():
        return float(dp_accounting.get_epsilon_gaussian(z / math.sqrt(n_releases), delta))


def client_budget(*, epsilon: float, delta: float, n_releases: int) -> PrivacyBudget:
    """Split a client's (``epsilon``, ``delta``) equally over ``n_releases`` releases."""
    z = noise_multiplier(epsilon=epsilon, delta=delta, n_releases=n_releases)
    return PrivacyBudget(
        float(epsilon),
        float(delta),
        int(n_releases),
        z,
        epsilon_spent(noise_multiplier=z, n_releases=n_releases, delta=delta),
    )


def _quiet_bracketing():
    """dp-accounting's bracket search evaluates log(1 - 1) = -inf at huge epsilon: a
    correct value there (no delta left) that numpy reports as a division by zero."""
    return np.errstate(divide="ignore")


def _check_positive(value, name: str) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected a number, got {value!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: expected a positive finite number, got {value!r}")
    return value


def _check_epsilon(value) -> float:
    value = _check_positive(value, "epsilon")
    low, high = EPSILON_RANGE
    if not low <= value <= high:
        raise ValueError(f"epsilon: expected a number in [{low:g}, {high:g}], got {value!r}")
    return value


def _check_delta(value) -> float:
    value = _check_positive(value, "delta")
    if value >= 1:
        raise ValueError(f"delta: expected a number in (0, 1), got {value!r}")
    return value
