"""A site's release policy: everything the site consents to release, in one place.

The policy is the site's own: the keys below, in its node config or in a TOML file that
the node config names (``policy = "/etc/distrank/policy.toml"``; then none of these keys
may also be in the node config). Every path a request can take -- plain scores, plain
sketches, secure sums -- goes through it, and through the same ledger:

    release-metrics  str, default "" (every registered metric): the metrics it releases
    share-stats      bool, default false: FD's moments (mean, covariance) may leave
    plain            str, default "": the plain answers it gives, "scores" and/or
                     "sketch" (comma-separated); "" answers secure requests only
    secure           bool, default true: it joins secure sums
    feature-bound    float, default 0 (none): rows are scaled to this L2 norm inside a
                     release; secure mode and a noised kernel release need it
    max-rows         int, default 1000000: a release uses at most this many rows
    min-rows         int, default 2: the rows the site has at least (public)
    min-sites        int, default 3: the fewest sites a secure sum it enters may cover
    noise-epsilon    float, default 0: > 0, every release is (epsilon, delta)-DP for the
    noise-delta      float              replacement of one row, with noise the site adds
    noise-kernels    str, default "rbf,laplace": the kernels of a noised KD release
    bandwidth-min    float, default 0: the bandwidth range of a noised rbf/laplace
    bandwidth-max    float, default 0 (no upper limit)
    colluders        int, default 0: members of a secure sum it assumes may collude
                     with the server (their noise does not count)
    rows             "public" or "noise", default "noise" with noise-epsilon, else
                     "public": whether n_i leaves exactly or with noise
    budget-epsilon   float, default 0: > 0, the epsilon (at noise-delta) that all its
                     releases may compose to; needs noise-epsilon and a ledger
    ledger           str: the JSON-lines file of every noised release (kept with or
                     without a budget)

What the site derives from the policy and the request, never from a value the server
chooses or from its data (:meth:`Policy.secure_noise`, :meth:`Policy.plain_noise`):

- the sensitivity of each released block to the replacement of one row, from the
  request's metrics, kernel (its range on the ball of ``feature-bound``, ``Kernel.range``),
  estimator and weights and the site's own ``feature-bound`` and ``min-rows``
  (``metrics._family.SecureSum.sensitivity``); a block without one is refused under noise;
- the noise: the release's budget split equally over its B blocks (each block's std is
  z sqrt(B) times its sensitivity, z = ``metrics._privacy.noise_multiplier``: the blocks
  compose exactly to one Gaussian mechanism of multiplier z); in a secure sum each
  site adds a 1 / (t - c) share of the variance, t the plan's threshold and c
  ``colluders``, so the honest sites of any sum the server can unmask add the whole;
- every refusal, before its data is read.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: the keys of a release policy (node config or policy file) and their defaults
POLICY_KEYS = {
    "release-metrics": "",
    "share-stats": False,
    "plain": "",
    "secure": True,
    "feature-bound": 0.0,
    "max-rows": 1000000,
    "min-rows": 2,
    "min-sites": 3,
    "noise-epsilon": 0.0,
    "noise-delta": 0.0,
    "noise-kernels": "rbf,laplace",
    "bandwidth-min": 0.0,
    "bandwidth-max": 0.0,
    "colluders": 0,
    "rows": "",
    "budget-epsilon": 0.0,
    "ledger": "",
}
PLAIN = ("scores", "sketch")
ROWS = ("public", "noise")


class Refused(ValueError):
    """A request that this site's policy refuses."""


@dataclass(frozen=True)
class Bounds:
    """What a release's sensitivity follows from: the rows' L2 bound, the fewest rows a
    site has, and the kernel's range on the ball of that bound ((0, 0): no kernel)."""

    feature_bound: float
    min_rows: int
    kernel_range: tuple[float, float] = (0.0, 0.0)

    @property
    def kernel_width(self) -> float:
        """hi - lo of the kernel's range: the most one kernel value can move."""
        return self.kernel_range[1] - self.kernel_range[0]


@dataclass(frozen=True)
class Policy:
    """A site's release policy, checked (module doc)."""

    metrics: tuple[str, ...] = ()  # () = every registered metric
    share_stats: bool = False
    plain: tuple[str, ...] = ()
    secure: bool = True
    feature_bound: float = 0.0
    max_rows: int = 1000000
    min_rows: int = 2
    min_sites: int = 3
    epsilon: float = 0.0
    delta: float = 0.0
    noise_kernels: tuple[str, ...] = ("rbf", "laplace")
    bandwidth: tuple[float, float] = (0.0, math.inf)
    colluders: int = 0
    rows: str = ""  # "" = "noise" under noise, else "public"
    budget: float = 0.0
    ledger: Path | None = field(default=None)

    def __post_init__(self):
        if not self.rows:
            object.__setattr__(self, "rows", "noise" if self.epsilon else "public")

    @classmethod
    def from_config(cls, config: Mapping, source: str = "node config") -> Policy:
        """The policy of ``config`` (a node config or a policy file's table); ValueError
        names ``source`` and the key."""
        c = _Reader(config, source)
        epsilon, delta = c.number("noise-epsilon"), c.number("noise-delta")
        rows = c.choice("rows", ROWS + ("",))
        high = c.number("bandwidth-max")
        out = cls(
            metrics=c.names("release-metrics"),
            share_stats=c.flag("share-stats"),
            plain=c.names("plain", PLAIN),
            secure=c.flag("secure"),
            feature_bound=c.number("feature-bound"),
            max_rows=c.integer("max-rows", 2),
            min_rows=c.integer("min-rows", 1),
            min_sites=c.integer("min-sites", 2),
            epsilon=epsilon,
            delta=delta,
            noise_kernels=c.names("noise-kernels"),
            bandwidth=(c.number("bandwidth-min"), high or math.inf),
            colluders=c.integer("colluders", 0),
            rows=rows,
            budget=c.number("budget-epsilon"),
            ledger=c.path("ledger"),
        )
        if (epsilon or out.budget) and not 0 < delta < 1:
            raise ValueError(f"{source}: 'noise-delta' must be in (0, 1) with 'noise-epsilon'")
        if out.budget and not epsilon:
            raise ValueError(
                f"{source}: 'budget-epsilon' needs 'noise-epsilon' > 0 (a budget caps noised "
                "releases; without noise every release would be exact)"
            )
        if out.budget and out.ledger is None:
            raise ValueError(f"{source}: 'budget-epsilon' needs a 'ledger' file")
        if out.rows == "noise" and not epsilon:
            raise ValueError(f"{source}: 'rows = \"noise\"' needs 'noise-epsilon' > 0")
        if out.min_rows > out.max_rows:
            raise ValueError(f"{source}: 'min-rows' {out.min_rows} is above 'max-rows'")
        return out

    @property
    def noisy(self) -> bool:
        return self.epsilon > 0

    # -- what may be asked --------------------------------------------------------------

    def allow(self, path: str, metrics) -> None:
        """Refused unless the policy opens ``path`` ("secure", "scores", "sketch") for
        every one of ``metrics``."""
        open_ = self.secure if path == "secure" else path in self.plain
        if not open_:
            what = "secure sums" if path == "secure" else f"plain {path}"
            raise Refused(f"this site's policy gives no {what}")
        if self.metrics and (others := [m for m in metrics if m not in self.metrics]):
            raise Refused(f"this site's policy releases no {others}")

    def bounds(self, options, dim: int, models: Mapping) -> Bounds:
        """The bounds of a release under ``options`` (a ``ScoreOptions``); Refused, before
        any data, when the models leave this site's ball, or a noised release's kernel
        is not one the policy accepts."""
        from distrank.metrics._kernels import make_kernel
        from distrank.metrics._registry import uses_kernel

        radius = self.feature_bound  # the ball of the site's rows and the models'
        for name, y in models.items():
            y = np.asarray(y)
            if y.ndim != 2 or y.shape[1] != dim or not np.isfinite(y).all():
                raise Refused(f"model {name!r}: expected finite (m, {dim}) features")
            largest = float(np.linalg.norm(np.asarray(y, np.float64), axis=1).max(initial=0))
            if self.feature_bound and largest > self.feature_bound * (1 + 1e-9):  # rounding
                raise Refused(f"model {name!r} has a row above this site's 'feature-bound'")
            radius = max(radius, largest)
        if not uses_kernel(options.metrics):
            return Bounds(self.feature_bound, self.min_rows)
        kernel = make_kernel(options.kernel, options.kernel_params, dim)
        if self.noisy:
            if kernel.name not in self.noise_kernels:
                raise Refused(
                    f"kernel {kernel.name!r}: this site's 'noise-kernels' are {self.noise_kernels}"
                )
            low, high = self.bandwidth
            if "bandwidth" in kernel.params and not low <= kernel.params["bandwidth"] <= high:
                raise Refused(
                    f"bandwidth {kernel.params['bandwidth']:g} is outside [{low:g}, {high:g}]"
                )
            if kernel.name not in ("rbf", "laplace") and not self.feature_bound:
                raise Refused(f"kernel {kernel.name!r} is unbounded without a 'feature-bound'")
        return Bounds(self.feature_bound, self.min_rows, kernel.range(radius))

    # -- the noise the site adds ----------------------------------------------------------

    def stds(self, sensitivities: Mapping[str, float | None], share: float = 1.0) -> dict:
        """Block -> the std of the noise this site adds ({} without noise): the policy's
        (epsilon, delta) split equally over the blocks (and ``rows`` when it is noised),
        a ``1 / share`` part of each block's variance. Refused for a block with no bound."""
        from distrank.metrics._privacy import noise_multiplier

        if not self.noisy:
            return {}
        if unbounded := [b for b, s in sensitivities.items() if s is None]:
            raise Refused(f"blocks {unbounded} have no bounded sensitivity to one row")
        sens = dict(sensitivities) | ({"rows": 1.0} if self.rows == "noise" else {})
        z = noise_multiplier(epsilon=self.epsilon, delta=self.delta) * math.sqrt(len(sens))
        return {block: z * s / math.sqrt(share) for block, s in sens.items()}

    def share(self, threshold: int) -> int:
        """t - c: the honest sites any sum the server can unmask covers at least."""
        honest = threshold - self.colluders
        if honest < 1:
            raise Refused(
                f"the plan's threshold {threshold} leaves no honest site beside this site's "
                f"'colluders' {self.colluders}"
            )
        return honest

    def clip(self, x: np.ndarray) -> np.ndarray:
        """The rows a release uses: the first ``max-rows``, each scaled to L2 norm at most
        ``feature-bound`` (data outside the bounds is clipped, never refused).
        ValueError (the same for every request) when the site has fewer than ``min-rows``
        or a non-finite row."""
        x = np.asarray(x)[: self.max_rows]
        if len(x) < self.min_rows or not np.isfinite(x).all():
            raise ValueError(
                f"this site's data break its own policy: {len(x)} rows (min-rows "
                f"{self.min_rows}), finite: {bool(np.isfinite(x).all())}"
            )
        if not self.feature_bound:
            return x
        norms = np.linalg.norm(np.asarray(x, np.float64), axis=1)
        over = norms > self.feature_bound
        if not over.any():
            return x
        x = np.array(x, dtype=np.result_type(x.dtype, np.float32))
        # a hair inside the bound, so that rounding leaves no scaled row above it
        shrink = 1 - 4 * np.finfo(x.dtype).eps
        x[over] *= (self.feature_bound / norms[over] * shrink)[:, None].astype(x.dtype)
        return x

    # -- the ledger ---------------------------------------------------------------------

    def spend(self, *, path: str, run: int, what) -> float:
        """Record a noised release in the ledger (if the policy keeps one). Its blocks
        compose, by :meth:`stds`' split, to one Gaussian mechanism of multiplier z(epsilon,
        delta) (in a secure sum, the honest sites' noise together). Refused past the
        budget. Returns the epsilon spent with it (0 without noise or ledger)."""
        from distrank.flower.ledger import Ledger
        from distrank.metrics._privacy import noise_multiplier

        if not self.noisy or self.ledger is None:
            return 0.0
        z = noise_multiplier(epsilon=self.epsilon, delta=self.delta)
        ledger = Ledger(self.ledger, self.budget or math.inf, self.delta)
        try:
            return ledger.record(run, z, path=path, what=list(what))
        except ValueError as err:
            raise Refused(str(err)) from None

    def summary(self) -> dict:
        """The public part of the policy a site attests with its reply."""
        return {
            "noise-epsilon": self.epsilon,
            "noise-delta": self.delta,
            "colluders": self.colluders,
            "rows": self.rows,
            "feature-bound": self.feature_bound,
            "min-rows": self.min_rows,
            "max-rows": self.max_rows,
            "budget-epsilon": self.budget,
        }


class _Reader:
    """Typed reads of a config mapping; ValueError names the source and the key."""

    def __init__(self, config: Mapping, source: str):
        self.config, self.source = config, source

    def get(self, key):
        return self.config.get(key, POLICY_KEYS[key])

    def fail(self, key, what, value):
        raise ValueError(f"{self.source}: {key!r} must be {what}, got {value!r}")

    def flag(self, key) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            self.fail(key, "true or false", value)
        return value

    def integer(self, key, least: int) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            self.fail(key, f"an int >= {least}", value)
        return value

    def number(self, key) -> float:
        value = self.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not (math.isfinite(value) and value >= 0)
        ):
            self.fail(key, "a number >= 0", value)
        return float(value)

    def names(self, key, allowed=None) -> tuple[str, ...]:
        value = self.get(key)
        if not isinstance(value, str):
            self.fail(key, "comma-separated names", value)
        names = tuple(v.strip() for v in value.split(",") if v.strip())
        if allowed is not None and (bad := [v for v in names if v not in allowed]):
            self.fail(key, f"a list of {list(allowed)}", bad)
        return names

    def choice(self, key, allowed) -> str:
        value = self.get(key)
        if value not in allowed:
            self.fail(key, f"one of {[a for a in allowed if a]}", value)
        return value

    def path(self, key) -> Path | None:
        value = self.get(key)
        if not isinstance(value, str):
            self.fail(key, "a path", value)
        return Path(value) if value else None


def load(config: Mapping) -> Policy:
    """The policy of a node config: its own keys, or the TOML file its ``policy`` names."""
    file = config.get("policy")
    if file is None:
        return Policy.from_config(config)
    if not isinstance(file, str) or not file:
        raise ValueError(f"node config: 'policy' must be the path of a TOML file, got {file!r}")
    if both := sorted(set(config) & set(POLICY_KEYS)):
        raise ValueError(f"node config: {both} are set both here and in the policy file {file}")
    try:
        table = tomllib.loads(Path(file).read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"{file}: not a readable TOML policy ({err})") from None
    if unknown := sorted(set(table) - set(POLICY_KEYS)):
        raise ValueError(f"{file}: unknown keys {unknown} (a policy has {sorted(POLICY_KEYS)})")
    return Policy.from_config(table, source=file)
