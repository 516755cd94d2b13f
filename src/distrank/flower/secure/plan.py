"""What both ends of secure mode agree on: the run's settings, the plan of a site's vector
and its quantisation to Flower's integers, and the round-1 messages.

Quantisation. SecAgg+ adds integers mod 2^40. Each entry v of a site's vector lies in
[-s, s], s the power of two above a bound from public settings only (F =
``feature-bound`` >= every row's L2 norm, N = ``max-rows`` >= every n_i; K = the
kernel's maximum on the ball of radius F):

    n_i: N     w_i KD_i: 4 K W     w_i Recall_i: W     S1: 2 F N     S2: 4 F^2 N

(W = N for size weights, 1 for uniform; |KD| <= 4 K for every estimator; |x - c| <=
2 F), each plus 40 times the plan's noise room of the block (``Plan.room``: the largest
std of a site's noise the range holds; a site whose own noise is larger refuses). A
site's rows are scaled to ``feature-bound`` and cut to ``max-rows`` inside its release
and the centre is checked against ``feature-bound`` before any data is read, so no
entry leaves its range: no answer depends on the data. A site rounds v
to the grid of 2^60 steps over [-s, s] (error <= s 2^-60) and sends it as two 30-bit
limbs; Flower's quantiser (clipping range 1, 2^30 levels) maps them to these integers
exactly. The sums are exact integers (k <= 1023 sites: k 2^30 < 2^40), so the summed
entry is off by at most k s 2^-60 -- below the float64 rounding of the summands. The
bound written for each number (``scores.bounds.csv``) adds that rounding, k s 2^-50
per summed entry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from distrank.flower.masks import GENERATOR
from distrank.flower.messages import encode_request
from distrank.metrics._registry import METRICS, models_free, uses_kernel

if TYPE_CHECKING:
    from distrank.flower.federation import RunSettings

#: the run config keys of secure mode and their defaults (the app's pyproject.toml has them)
SECURE_CONFIG = {
    "secure": False,
    "feature-bound": 0.0,
    "max-rows": 1000000,
    "secure-threshold": 0,
    "noise-epsilon": 0.0,
    "noise-delta": 0.0,
}
LIMB = 30  # bits of one limb: Flower's quantiser casts to int32
LEVELS = 1 << LIMB  # SecAggPlusWorkflow's quantization_range
HALF = 1 << (2 * LIMB - 1)  # the grid over [-s, s] has 2 * HALF steps
MODULUS = 1 << 40  # SecAgg+'s modulus: sums of up to MAX_SITES sites' limbs stay below it
MAX_SITES = MODULUS // LEVELS - 1  # 1023: Flower also sums each site's factor 2^30 mod 2^40
GRID_ERROR = 2.0**-60  # quantisation: |error| <= s 2^-60 per entry and site
SUM_ERROR = 2.0**-50  # written bound per entry and site: quantisation and float rounding
NOISE_MARGIN = 40.0  # the KD range holds a site's noise up to this many standard deviations
SIGNED = "distrank.signed"  # a site's signed statement, in its setup and masked-vector replies
KEYS = "distrank.keys"  # every node's signed keys, forwarded with the share-keys request
VIEWS = "distrank.views"  # every active node's signed view, forwarded with the unmask request


class OutOfBounds(ValueError):
    """A value outside the public bounds of the plan (the message names the setting)."""


@dataclass(frozen=True)
class SecureSettings:
    """The secure-mode keys of the run config, checked. ``epsilon``/``delta``: the noise
    the server asks for (0: none); each site adds the noise of its own policy."""

    feature_bound: float
    max_rows: int
    threshold: int
    epsilon: float = 0.0
    delta: float = 0.0

    @classmethod
    def from_run_config(cls, config: Mapping, settings: RunSettings) -> SecureSettings | None:
        """The settings, or None when ``secure`` is false. ValueError names the key."""

        def get(key, kind):
            value = config.get(key, SECURE_CONFIG[key])
            if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
                raise ValueError(f"run config: {key!r} must be {kind.__name__}, got {value!r}")
            return value

        if not get("secure", bool):
            return None
        refused = [m for m in settings.options["metrics"] if METRICS[m].secure is None]
        if refused:
            why = "; ".join(f"{METRICS[m].display}: {METRICS[m].why_not}" for m in refused)
            raise ValueError(
                f"run config: metrics {refused} are refused in secure mode: it writes only "
                f"what a secure sum of the sites' values gives (Metric.secure); {why}"
            )
        bound = float(get("feature-bound", (int, float)))
        if not (math.isfinite(bound) and bound > 0):
            raise ValueError(
                "run config: secure mode needs 'feature-bound' > 0, a public bound on the "
                f"L2 norm of every feature row (sites' and models'), got {bound!r}"
            )
        rows = get("max-rows", int)
        if rows < 2:
            raise ValueError(f"run config: 'max-rows' must be at least 2, got {rows!r}")
        k = len(settings.sites)
        if not 2 <= k <= MAX_SITES:
            raise ValueError(
                f"run config: secure mode sums 2..{MAX_SITES} 'sites' (a sum of one is its "
                f"value; SecAgg+'s modulus 2^40 holds {MAX_SITES} sites' 30-bit limbs), got {k}"
            )
        majority = k // 2 + 1
        threshold = get("secure-threshold", int) or majority
        if not majority <= threshold <= k:
            raise ValueError(
                f"run config: 'secure-threshold' must be 0 (a majority) or {majority}..{k}, a "
                f"majority of the sites (fewer lets a server unmask one site), got {threshold!r}"
            )
        epsilon, delta = _noise_keys(get)
        return cls(bound, rows, threshold, epsilon, delta)


def _noise_keys(get) -> tuple[float, float]:
    """(noise-epsilon, noise-delta) of the run config; ValueError names the key."""
    epsilon = float(get("noise-epsilon", (int, float)))
    delta = float(get("noise-delta", (int, float)))
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"run config: 'noise-epsilon' must be a number >= 0, got {epsilon!r}")
    if epsilon and not 0 < delta < 1:
        raise ValueError(
            f"run config: 'noise-epsilon' needs 'noise-delta' in (0, 1), got {delta!r}"
        )
    return epsilon, delta


def kernel_bound(kernel: str, params: Mapping | None, dim: int, radius: float) -> float:
    """max |k(x, y)| over |x|, |y| <= ``radius`` (``Kernel.bound``) of the run's kernel."""
    from distrank.metrics._kernels import make_kernel

    return make_kernel(kernel, params, dim).bound(radius)


@dataclass(frozen=True)
class Plan:
    """What a site's vector holds -- its row count, then each metric's entries
    (``Metric.secure``) -- each entry's clipping range, the noise room of each block
    (the largest std of a site's noise its range holds: 40 of them) and the mask
    generator; public, sent to the sites. The noise itself is each site's own."""

    models: tuple[str, ...]
    metrics: tuple[str, ...]  # each with a secure sum, in the order asked
    dim: int
    weights: str
    feature_bound: float
    max_rows: int
    kernel_bound: float
    room: tuple[tuple[str, float], ...] = ()  # (block, std): the site noise its range holds
    generator: str = GENERATOR
    threshold: int = 2  # the sites any unmasked sum covers at least (SecAgg+'s threshold)
    seed: int = 0  # of a sketch's public feature map (kd_sketch)
    bandwidth: float = 0.0  # of the rbf kernel a sketch's map approximates (kd_sketch)

    def sums(self) -> dict:
        """Metric key -> its secure sum."""
        return {m: METRICS[m].secure for m in self.metrics}

    @property
    def moments(self) -> tuple[str, ...]:
        """The metrics whose entries hold a site's moments (node config share-stats)."""
        return tuple(m for m, s in self.sums().items() if s.moments)

    def blocks(self) -> list[tuple[str, int, float, str]]:
        """(name, length, bound on |entry|, the settings that raise it) of each block."""
        settings = "'feature-bound' or 'max-rows'"
        blocks = [("rows", 1, self.max_rows, "'max-rows'")]
        for secure in self.sums().values():
            blocks += [(name, n, bound, settings) for name, n, bound in secure.blocks(self)]
        room = dict(self.room)
        blocks = [(b, n, bound + NOISE_MARGIN * room.get(b, 0.0), s) for b, n, bound, s in blocks]
        if len({b[0] for b in blocks}) != len(blocks):
            raise ValueError(f"metrics {self.metrics}: two secure sums name one block")
        return blocks

    def scales(self) -> dict[str, float]:
        """The clipping range s of each block: the power of two above its bound (and margin)."""
        return {name: scale_above(bound) for name, _, bound, _ in self.blocks()}

    def sensitivities(self, bounds, options) -> dict[str, float | None]:
        """Block -> its L2 sensitivity to one row of a site with ``bounds`` under the
        request's ``options`` (``SecureSum.sensitivity``; None: unbounded)."""
        out: dict[str, float | None] = {}
        for secure in self.sums().values():
            out |= secure.sensitivity(self, bounds, options)
        return out

    def length(self) -> int:
        return sum(length for _, length, _, _ in self.blocks())

    def to_config(self) -> ConfigRecord:
        return ConfigRecord(
            {
                "models": list(self.models),
                "metrics": list(self.metrics),
                "dim": self.dim,
                "weights": self.weights,
                "feature-bound": float(self.feature_bound),
                "max-rows": self.max_rows,
                "kernel-bound": float(self.kernel_bound),
                "noise-room": json.dumps(dict(self.room)),
                "generator": self.generator,
                "threshold": self.threshold,
                "seed": self.seed,
                "bandwidth": float(self.bandwidth),
            }
        )

    @classmethod
    def from_config(cls, record: Mapping) -> Plan:
        try:
            plan = cls(
                tuple(record["models"]),
                tuple(record["metrics"]),
                int(record["dim"]),
                str(record["weights"]),
                float(record["feature-bound"]),
                int(record["max-rows"]),
                float(record["kernel-bound"]),
                tuple(json.loads(str(record["noise-room"])).items()),
                str(record["generator"]),
                int(record["threshold"]),
                int(record["seed"]),
                float(record["bandwidth"]),
            )
        except KeyError as err:
            raise ValueError(f"secure request: no {err.args[0]!r} in its plan") from None
        except (TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"secure request: a malformed plan ({err})") from None
        unknown = [m for m in plan.metrics if m not in METRICS or METRICS[m].secure is None]
        if unknown:
            raise ValueError(f"secure request: no secure sum of metrics {unknown} here")
        return plan


def scale_above(bound: float) -> float:
    """The power of two strictly above ``bound`` * (1 + 2^-10) (room for float32 rounding)."""
    _, exponent = math.frexp(bound * (1 + 2.0**-10))
    return math.ldexp(1.0, exponent)


def make_plan(settings: RunSettings, secure: SecureSettings, models: Mapping) -> Plan:
    """The plan of a run; ValueError names a model row above ``feature-bound``."""
    dims = {np.asarray(y).shape[1] for y in models.values()}
    if len(dims) != 1:
        raise ValueError(f"models: feature dimensions differ: {sorted(dims)}")
    for name, y in models.items():
        if not np.all(np.linalg.norm(np.asarray(y, np.float64), axis=1) <= secure.feature_bound):
            raise ValueError(
                f"models[{name!r}]: a row's L2 norm exceeds the run config's 'feature-bound' "
                f"{secure.feature_bound:g}: raise it"
            )
    o, dim = settings.options, dims.pop()
    k_max = kernel_bound(o["kernel"], o["kernel_params"], dim, secure.feature_bound)
    plan = Plan(
        () if sketch_only(o["metrics"]) else tuple(models),  # a sketch needs no model
        tuple(o["metrics"]),
        dim,
        settings.weights,
        secure.feature_bound,
        secure.max_rows,
        k_max if uses_kernel(o["metrics"]) else 0.0,
        threshold=secure.threshold,
        seed=o["seed"],
        bandwidth=float((o["kernel_params"] or {}).get("bandwidth", 0.0)),
    )
    return (
        replace(plan, room=noise_room(plan, settings.score_options, secure))
        if secure.epsilon
        else plan
    )


def noise_room(plan: Plan, options, secure: SecureSettings) -> tuple[tuple[str, float], ...]:
    """The noise room of each block for a run that asks for (epsilon, delta): the std a
    site with that policy adds when it counts on no other site's noise (c = t - 1), with
    the plan's bounds, one row at least and a noised row count: at least what any site
    of that epsilon adds. ValueError names the run config when a block has no bound."""
    from distrank.flower.policy import Policy, Refused
    from distrank.metrics._metric import KERNELS

    policy = Policy(
        feature_bound=plan.feature_bound,
        min_rows=1,
        epsilon=secure.epsilon,
        delta=secure.delta,
        noise_kernels=KERNELS,
        rows="noise",
    )
    try:
        bounds = policy.bounds(options, plan.dim, {})
        return tuple(policy.stds(plan.sensitivities(bounds, options)).items())
    except Refused as err:
        raise ValueError(f"run config: 'noise-epsilon' {secure.epsilon:g}: {err}") from None


def sketch_only(metrics) -> bool:
    """Whether a run's metrics need no model at the sites (``Metric.needs_models``): the
    sites release their sketches' sum alone and no model goes down."""
    return models_free(metrics)


def public_centre(models: Mapping) -> np.ndarray:
    """c: the mean of every generated row (public: the server sends it)."""
    return np.concatenate([np.asarray(y, np.float64) for y in models.values()]).mean(axis=0)


def encode(vector: np.ndarray, plan: Plan) -> np.ndarray:
    """The vector as Flower's SecAgg+ quantiser takes it: two 30-bit limbs per entry.

    Entry v in [-s, s] becomes the integer W = rint(v 2^59 / s) + 2^59 in [0, 2^60],
    split into hi = W >> 30 and lo = W mod 2^30, each sent as z 2^-29 - 1 in [-1, 1],
    which the quantiser (clipping range 1, 2^30 levels) maps back to z exactly.
    A value outside [-s, s] is an :class:`OutOfBounds` naming the setting to raise.
    """
    scales = entry_scales(plan)
    if vector.shape != scales.shape:
        raise ValueError(f"vector: {vector.shape[0]} entries, the plan has {scales.shape[0]}")
    inside = np.abs(vector) <= scales  # False for nan
    if not inside.all():
        block = _block_of(plan, int(np.argmin(inside)))
        raise OutOfBounds(
            f"a value of block {block[0]!r} is outside its clipping range "
            f"[-{scales[np.argmin(inside)]:g}, {scales[np.argmin(inside)]:g}]: raise {block[3]}"
        )
    w = np.rint(vector * (HALF / scales)).astype(np.int64) + HALF
    z = np.concatenate([w >> LIMB, w & (LEVELS - 1)])
    return np.ldexp(z.astype(np.float64), 1 - LIMB) - 1.0


def decode(mean: np.ndarray, k: int, plan: Plan) -> np.ndarray:
    """The summed float64 vector from Flower's aggregate of k sites' limbs.

    Flower hands over (sum z 2^-29 - k) / k; the integer sums of z come back exactly
    (float error < 2^-20 of a unit) and recombine to sum_i rint(v_i 2^59 / s) 2^-59 s.
    A non-finite or non-integer aggregate is a ValueError.
    """
    if not np.isfinite(mean).all():
        raise ValueError("secure sum: the aggregate holds non-finite values")
    z = (mean * k + k) * 2.0 ** (LIMB - 1)
    sums = np.rint(z)
    if np.abs(z - sums).max(initial=0.0) > 0.25:
        raise ValueError("secure sum: the aggregate is not an integer vector (Flower changed?)")
    half = sums.shape[0] // 2
    hi, lo = sums[:half].astype(np.int64), sums[half:].astype(np.int64)
    grid = (hi - k * (HALF >> LIMB)).astype(np.float64) * 2.0 ** (LIMB - 2 * LIMB + 1)
    grid = grid + lo.astype(np.float64) * 2.0 ** (1 - 2 * LIMB)
    return grid * entry_scales(plan)


def entry_scales(plan: Plan) -> np.ndarray:
    scales = plan.scales()
    return np.concatenate([np.full(length, scales[name]) for name, length, _, _ in plan.blocks()])


def _block_of(plan: Plan, index: int) -> tuple[str, int, float, str]:
    for block in plan.blocks():
        if index < block[1]:
            return block
        index -= block[1]
    raise IndexError(index)


def split(vector: np.ndarray, plan: Plan) -> dict[str, np.ndarray]:
    """The blocks of a vector in the plan's layout, by name."""
    out, start = {}, 0
    for name, length, _, _ in plan.blocks():
        out[name] = vector[start : start + length]
        start += length
    return out


# -- round 1: the request and the sites' replies ----------------------------------------


def encode_secure_request(
    models: Mapping, options: Mapping, plan: Plan, centre: np.ndarray
) -> RecordDict:
    """Round 1: the plain request plus the plan and the centre."""
    content = encode_request(models, options)
    content["secure"] = plan.to_config()
    content["centre"] = ArrayRecord({"c": Array(np.asarray(centre, np.float64))})
    return content


@dataclass(frozen=True)
class Ready:
    """A site's round-1 reply: its id, its node, whether it adds its moments, what it
    attests (``attested``: the parsed content; ``signed``: [statement, signature]), or an
    error category."""

    site: int | str
    node: int
    moments: bool = False
    error: str = ""
    attested: Mapping = field(default_factory=dict)
    signed: tuple = ()


def encode_ready(
    site_id, *, moments: bool = False, error: str = "", attested: ConfigRecord | None = None
) -> RecordDict:
    """A site's round-1 reply; ``attested``: ``secure.site.attestation``'s record."""
    record = {"site-id": site_id, "moments": moments, "error": error}
    return RecordDict({"site": ConfigRecord(record), "attested": attested or ConfigRecord({})})


def decode_ready(reply: Message) -> Ready:
    if "site" not in reply.content.config_records:
        raise ValueError("reply: no 'site' record")
    record = reply.content.config_records["site"]
    site = record.get("site-id")
    if isinstance(site, bool) or not isinstance(site, (int, str)):
        raise ValueError(f"reply: site-id must be an int or a str, got {site!r}")
    error = str(record.get("error") or "")
    attested = reply.content.config_records.get("attested", {})
    content = json.loads(str(attested.get("content", "{}")))
    signed = tuple(attested.get("signed", ()))
    return Ready(
        site, reply.metadata.src_node_id, bool(record.get("moments")), error, content, signed
    )
