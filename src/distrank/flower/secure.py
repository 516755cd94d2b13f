"""Secure mode (``secure = true``): the server learns the sum of the sites' vectors, nothing else.

With lambda_i = n_i / n, KD_avg and Recall_avg are weighted sums, and FD_all needs
only the pooled moments, which are sums too. Each site sends, through Flower's
SecAgg+ (Bell et al., "Secure single-server aggregation with (poly)logarithmic
overhead", CCS 2020: ``SecAggPlusWorkflow`` on the server, ``secaggplus_mod`` on
the site), the vector

    [n_i,  w_i KD_i(model 1..M),  w_i Recall_i(1..M),
     S1_i = sum_rows (x - c),  upper triangle of S2_i = sum_rows (x - c)(x - c)^T]

(w_i = n_i for ``weights = "size"``, 1 for ``"uniform"``; the FD part only when FD is
requested, and every site allows it: node config ``share-stats``; c is a public
centre, the mean of all generated rows, against cancellation). The server unmasks
only the sum over the sites and writes

    KD, Recall  avg = sum_i w_i D_i / sum_i w_i           (as ``distrank score``)
    FD          all = FD(N(c + S1 / n, (S2 - S1 S1^T / n) / (n - 1)), model)

which are FD_all on the pooled rows: S2 - S1 S1^T / n is the pooled scatter, hence
the (n - 1) of the pooled covariance. No ``client`` rows (nobody has them), no
``kd_std``, and no FD_avg, which need not rank like FD_all. Precision, Density and
Coverage are refused: the pooled value needs nearest-neighbour radii among all sites'
rows, which no sum of site values gives, and their client averages need not rank like
the pooled metric (``metrics.registry``).

Quantisation. SecAgg+ adds integers mod 2^40. Each entry v of a site's vector lies in
[-s, s], s the power of two above a bound from public settings only (F =
``feature-bound`` >= every row's L2 norm, N = ``max-rows`` >= every n_i; K = the
kernel's maximum on the ball of radius F):

    n_i: N     w_i KD_i: 4 K W     w_i Recall_i: W     S1: 2 F N     S2: 4 F^2 N

(W = N for size weights, 1 for uniform; |KD| <= 4 K for every estimator; |x - c| <=
2 F). A site rounds v to the grid of 2^60 steps over [-s, s] (error <= s 2^-60) and
sends it as two 30-bit limbs; Flower's quantiser (clipping range 1, 2^30 levels) maps
them to these integers exactly. The sums are exact integers (k sites), so the summed
entry is off by at most k s 2^-60 -- below the float64 rounding of the summands. The
bound written for each number (``scores.bounds.csv``) adds that rounding, k s 2^-50 per
summed entry, and holds against what plain mode computes from the same site values
(KD_avg: k s_KD 2^-50 / sum_i w_i). A row
above ``feature-bound`` or a site above ``max-rows`` is an error naming the setting
to raise, never a clip. FD's bound follows the perturbation of the pooled mean and
covariance (:func:`fd_bound`).

Threat model: a server that follows the protocol; it sees each site's masked vector,
the key shares SecAgg+ sends it, the unmasked sum and each site's reply time. Flower
1.42 seeds its mask generator with 32 bits (``secaggplus_utils.pseudo_rand_gen``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    Parameters,
    Status,
    log,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server.workflow import SecAggPlusWorkflow

from distrank.flower.messages import decode_request, encode_request

if TYPE_CHECKING:  # the ClientApp's SecAgg+ stages import neither pandas nor torch
    import pandas as pd
    from flwr.serverapp import Grid

    from distrank.flower.server import RunSettings

#: the run config keys of secure mode and their defaults (the app's pyproject.toml has them)
SECURE_CONFIG = {
    "secure": False,
    "feature-bound": 0.0,
    "max-rows": 1000000,
    "secure-threshold": 0,
}
#: the metrics secure mode writes: KD and Recall avg, FD all
SECURE_METRICS = ("kd", "fd", "recall")
REFUSED = (
    "secure mode writes only what a secure sum of the sites' values gives and ranks like "
    "the pooled data (KD_avg, Recall_avg = Recall_all, FD_all); the pooled Precision, "
    "Density and Coverage need nearest-neighbour radii among all sites' rows, which no "
    "sum gives, and their client averages need not rank like them"
)
LIMB = 30  # bits of one limb: Flower's quantiser casts to int32
LEVELS = 1 << LIMB  # SecAggPlusWorkflow's quantization_range
HALF = 1 << (2 * LIMB - 1)  # the grid over [-s, s] has 2 * HALF steps
MODULUS = 1 << 40  # sums of up to 1023 sites' limbs stay below it
STATE = "distrank.secure"  # the site's context.state record of its prepared vector
GRID_ERROR = 2.0**-60  # quantisation: |error| <= s 2^-60 per entry and site
SUM_ERROR = 2.0**-50  # written bound per entry and site: quantisation and float rounding


@dataclass(frozen=True)
class SecureSettings:
    """The secure-mode keys of the run config, checked."""

    feature_bound: float
    max_rows: int
    threshold: int

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
        refused = [m for m in settings.options["metrics"] if m not in SECURE_METRICS]
        if refused:
            raise ValueError(f"run config: metrics {refused} are refused in secure mode: {REFUSED}")
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
        if k < 2:
            raise ValueError("run config: secure mode needs at least 2 'sites' (a sum of one)")
        threshold = get("secure-threshold", int) or k // 2 + 1
        if not 2 <= threshold <= k:
            raise ValueError(
                f"run config: 'secure-threshold' must be 0 (a majority) or 2..{k}, got {threshold!r}"
            )
        return cls(bound, rows, threshold)


def kernel_bound(kernel: str, params: Mapping | None, dim: int, radius: float) -> float:
    """max |k(x, y)| over |x|, |y| <= ``radius`` (poly: (gamma r^2 + |coef0|)^degree)."""
    from distrank.metrics.kernels import make_kernel

    k = make_kernel(kernel, params, dim)
    if k.name == "poly":
        p = k.params
        return (p["gamma"] * radius**2 + abs(p["coef0"])) ** p["degree"]
    return radius**2 if k.name == "linear" else 1.0


@dataclass(frozen=True)
class Plan:
    """What a site's vector holds and each entry's clipping range; public, sent to the sites."""

    models: tuple[str, ...]
    metrics: tuple[str, ...]  # the weighted sums, of "kd" and "recall"
    fd: bool
    dim: int
    weights: str
    feature_bound: float
    max_rows: int
    kernel_bound: float

    def blocks(self) -> list[tuple[str, int, float, str]]:
        """(name, length, bound on |entry|, the settings that raise it) of each block."""
        f, n = self.feature_bound, self.max_rows
        w = n if self.weights == "size" else 1
        settings = "'feature-bound' or 'max-rows'"
        blocks = [("rows", 1, n, "'max-rows'")]
        for metric in self.metrics:
            bound = 4 * self.kernel_bound * w if metric == "kd" else w
            blocks.append((metric, len(self.models), bound, settings))
        if self.fd:
            d = self.dim
            blocks.append(("sum", d, 2 * f * n, settings))
            blocks.append(("scatter", d * (d + 1) // 2, 4 * f * f * n, settings))
        return blocks

    def scales(self) -> dict[str, float]:
        """The clipping range s of each block: the power of two above its bound (and margin)."""
        return {name: scale_above(bound) for name, _, bound, _ in self.blocks()}

    def length(self) -> int:
        return sum(length for _, length, _, _ in self.blocks())

    def to_config(self) -> ConfigRecord:
        return ConfigRecord(
            {
                "models": list(self.models),
                "metrics": list(self.metrics),
                "fd": self.fd,
                "dim": self.dim,
                "weights": self.weights,
                "feature-bound": float(self.feature_bound),
                "max-rows": self.max_rows,
                "kernel-bound": float(self.kernel_bound),
            }
        )

    @classmethod
    def from_config(cls, record: Mapping) -> Plan:
        try:
            return cls(
                tuple(record["models"]),
                tuple(record["metrics"]),
                bool(record["fd"]),
                int(record["dim"]),
                str(record["weights"]),
                float(record["feature-bound"]),
                int(record["max-rows"]),
                float(record["kernel-bound"]),
            )
        except KeyError as err:
            raise ValueError(f"secure request: no {err.args[0]!r} in its plan") from None


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
    metrics = tuple(m for m in o["metrics"] if m in ("kd", "recall"))
    k_max = kernel_bound(o["kernel"], o["kernel_params"], dim, secure.feature_bound)
    return Plan(
        tuple(models),
        metrics,
        "fd" in o["metrics"],
        dim,
        settings.weights,
        secure.feature_bound,
        secure.max_rows,
        k_max if "kd" in metrics else 0.0,
    )


def public_centre(models: Mapping) -> np.ndarray:
    """c: the mean of every generated row (public: the server sends it)."""
    return np.concatenate([np.asarray(y, np.float64) for y in models.values()]).mean(axis=0)


# -- the site ---------------------------------------------------------------------------


def encode_secure_request(
    models: Mapping, options: Mapping, plan: Plan, centre: np.ndarray
) -> RecordDict:
    """Round 1: the plain request plus the plan and the centre."""
    content = encode_request(models, options)
    content["secure"] = plan.to_config()
    content["centre"] = ArrayRecord({"c": Array(np.asarray(centre, np.float64))})
    return content


def site_vector(
    x: np.ndarray, models: Mapping, options: Mapping, plan: Plan, centre, device=None
) -> np.ndarray:
    """A site's float64 vector in the plan's layout, after checking its rows against the
    plan's public bounds (ValueError names the setting to raise)."""
    from distrank.metrics import score_client
    from distrank.metrics.fd import gaussian_stats

    n = len(x)
    if n > plan.max_rows:
        log(WARNING, "distrank: this site has %d rows, above 'max-rows' %d", n, plan.max_rows)
        raise ValueError(
            f"this site has more rows than the run config's 'max-rows' {plan.max_rows}"
        )
    norms = np.linalg.norm(np.asarray(x, np.float64), axis=1)
    if not np.all(norms <= plan.feature_bound):
        log(WARNING, "distrank: a row has L2 norm %g > 'feature-bound'", float(np.max(norms)))
        raise ValueError(
            f"a row of this site has an L2 norm above the run config's 'feature-bound' "
            f"{plan.feature_bound:g}: raise it"
        )
    w = n if plan.weights == "size" else 1
    parts = [np.array([n], np.float64)]
    if plan.metrics:
        scores = score_client(
            x, models, device=device, **(dict(options) | {"metrics": plan.metrics})
        )
        for metric in plan.metrics:
            parts.append(np.array([w * scores[m][metric] for m in plan.models], np.float64))
    if plan.fd:
        stats = gaussian_stats(x, device=device)
        offset = stats.mean - np.asarray(centre, np.float64)
        scatter = (n - 1) * stats.cov + n * np.outer(offset, offset)
        parts += [n * offset, scatter[np.triu_indices(plan.dim)]]
    return np.concatenate(parts)


def encode(vector: np.ndarray, plan: Plan) -> np.ndarray:
    """The vector as Flower's SecAgg+ quantiser takes it: two 30-bit limbs per entry.

    Entry v in [-s, s] becomes the integer W = rint(v 2^59 / s) + 2^59 in [0, 2^60],
    split into hi = W >> 30 and lo = W mod 2^30, each sent as z 2^-29 - 1 in [-1, 1],
    which the quantiser (clipping range 1, 2^30 levels) maps back to z exactly.
    A value outside [-s, s] is a ValueError naming the setting to raise.
    """
    scales = _entry_scales(plan)
    if vector.shape != scales.shape:
        raise ValueError(f"vector: {vector.shape[0]} entries, the plan has {scales.shape[0]}")
    inside = np.abs(vector) <= scales  # False for nan
    if not inside.all():
        block = _block_of(plan, int(np.argmin(inside)))
        raise ValueError(
            f"a value of block {block[0]!r} is outside its clipping range "
            f"[-{scales[np.argmin(inside)]:g}, {scales[np.argmin(inside)]:g}]: raise {block[3]}"
        )
    w = np.rint(vector * (HALF / scales)).astype(np.int64) + HALF
    z = np.concatenate([w >> LIMB, w & (LEVELS - 1)])
    return np.ldexp(z.astype(np.float64), 1 - LIMB) - 1.0


def prepare(site, content: RecordDict, state: RecordDict) -> RecordDict:
    """Round 1 at a site (a ``SiteConfig``): compute, check and keep its encoded vector in
    ``state`` (it stays on the site); reply only the site id, whether it joins FD, or an error."""
    from distrank.features.cache import load_features

    try:
        models, options, _ = decode_request(content)
        if "secure" not in content.config_records or "centre" not in content.array_records:
            raise ValueError("secure request: no plan")
        plan = Plan.from_config(content.config_records["secure"])
        if plan.fd and not site.share_stats:
            return encode_ready(site.site, fd=False)
        centre = content.array_records["centre"]["c"].numpy()
        x = load_features(site.features)
        limbs = encode(site_vector(x, models, options, plan, centre, site.device), plan)
    except (ValueError, OSError) as err:
        return encode_ready(site.site, error=f"{type(err).__name__}: {err}")
    state[STATE] = ArrayRecord({"limbs": Array(limbs)})
    return encode_ready(site.site, fd=plan.fd)


def share(site_id, content: RecordDict, state: RecordDict) -> RecordDict:
    """SecAgg+ stage 2 at a site: its prepared vector as a FitRes, which ``secaggplus_mod``
    quantises and masks. The FitRes metrics (plain) hold the site id only."""
    if STATE not in state.array_records:
        raise ValueError("secure mode: no prepared vector at this site for this run")
    limbs = state.array_records.pop(STATE)["limbs"].numpy()
    config = compat.recorddict_to_fitins(content, keep_input=True).config
    if config.get("length") != limbs.shape[0]:
        raise ValueError(f"secure mode: the server expects {config.get('length')} entries")
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([limbs]), 1, {"site-id": site_id})
    return compat.fitres_to_recorddict(res, keep_input=False)


@dataclass(frozen=True)
class Ready:
    """A site's round-1 reply: its id, its node, whether it joins FD, or an error."""

    site: int | str
    node: int
    fd: bool = False
    error: str = ""


def encode_ready(site_id, *, fd: bool = False, error: str = "") -> RecordDict:
    return RecordDict({"site": ConfigRecord({"site-id": site_id, "fd": fd, "error": error})})


def decode_ready(reply: Message) -> Ready:
    if "site" not in reply.content.config_records:
        raise ValueError("reply: no 'site' record")
    record = reply.content.config_records["site"]
    site = record.get("site-id")
    if isinstance(site, bool) or not isinstance(site, (int, str)):
        raise ValueError(f"reply: site-id must be an int or a str, got {site!r}")
    error = str(record.get("error") or "")
    return Ready(site, reply.metadata.src_node_id, bool(record.get("fd")), error)


# -- the server -------------------------------------------------------------------------


def main(grid: Grid, context: Context) -> None:
    """Secure mode's ServerApp body: the table (and its bounds) from the secure sum."""
    from distrank._io import atomic_path
    from distrank.features.cache import load_features
    from distrank.flower.server import FederationError, RunSettings, gather

    settings = RunSettings.from_run_config(context.run_config)
    secure = SecureSettings.from_run_config(context.run_config, settings)
    models = {name: load_features(path) for name, path in settings.models.items()}
    plan = make_plan(settings, secure, models)
    centre = public_centre(models)
    ready = gather(
        grid,
        encode_secure_request(models, settings.options, plan, centre),
        sites=settings.sites,
        timeout=settings.timeout,
        decode=decode_ready,
    )
    if plan.fd and (without := [r.site for r in ready if not r.fd]):
        raise FederationError(
            f"FD_all needs every site's moments in the secure sum; site(s) {without} do not "
            "allow it (node config share-stats=false): drop 'fd' from 'metrics'"
        )
    nodes = {r.node: str(r.site) for r in ready}
    total, included = secure_sum(
        grid,
        context,
        nodes,
        plan.length() * 2,
        threshold=secure.threshold,
        timeout=settings.timeout,
    )
    if dropped := [s for s in settings.sites if s not in included]:
        log(WARNING, "distrank: site(s) %s dropped out: the sum is over %s", dropped, included)
    table, bounds = secure_table(total, len(included), plan, models, centre)
    with atomic_path(bounds_path(settings.out)) as tmp:
        bounds.to_csv(tmp, index=False)
    with atomic_path(settings.out) as tmp:
        table.to_csv(tmp, index=False)
    log(
        INFO,
        "distrank: wrote %d rows summed over sites %s to %s",
        len(table),
        included,
        settings.out,
    )
    if settings.report is not None:
        from distrank.report.html import write_report

        write_report(
            table,
            settings.report,
            meta={"options": {"weights": settings.weights}},
            title="Consistency report: federated evaluation, secure sum",
            source=settings.out,
        )


def bounds_path(out):
    """Where the bounds go: ``scores.csv`` -> ``scores.bounds.csv``."""
    return out.with_name(f"{out.stem}.bounds{out.suffix}")


class _Node:
    """What SecAggPlusWorkflow reads of a ClientProxy: its node id."""

    def __init__(self, node_id: int):
        self.node_id = node_id


class _SumStrategy:
    """The two Strategy methods SecAggPlusWorkflow calls: every site in one fit round, whose
    aggregate (the unmasked sum, as Flower's mean) is kept, not averaged further."""

    def __init__(self, nodes: Sequence[int], length: int):
        self.nodes, self.length, self.results = list(nodes), length, None

    def configure_fit(self, server_round, parameters, client_manager):
        ins = FitIns(Parameters([], "numpy.ndarray"), {"length": self.length})
        return [(_Node(node), ins) for node in self.nodes]

    def aggregate_fit(self, server_round, results, failures):
        self.results = results
        return None, {}


class _Workflow(SecAggPlusWorkflow):
    """SecAggPlusWorkflow noting, after each stage, which nodes are still in."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trace: list[tuple[str, bool, set, set, list]] = []

    def _note(self, stage, ok, state):
        failures = [getattr(f.args[0], "reason", str(f)) for f in state.failures if f.args]
        self.trace.append(
            (stage, ok, set(state.sampled_node_ids), set(state.active_node_ids), failures)
        )
        return ok

    def setup_stage(self, grid, context, state):
        return self._note("setup", super().setup_stage(grid, context, state), state)

    def share_keys_stage(self, grid, context, state):
        return self._note("share keys", super().share_keys_stage(grid, context, state), state)

    def collect_masked_vectors_stage(self, grid, context, state):
        ok = super().collect_masked_vectors_stage(grid, context, state)
        return self._note("collect masked vectors", ok, state)

    def unmask_stage(self, grid, context, state):
        return self._note("unmask", super().unmask_stage(grid, context, state), state)


class _PollingGrid:
    """The grid, with ``send_and_receive`` polling every ``poll`` s (Flower's polls every 3 s)."""

    def __init__(self, grid: Grid, poll: float):
        self.grid, self.poll = grid, poll

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        pending = set(self.grid.push_messages(list(messages)))
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        while pending:
            replies = list(self.grid.pull_messages(list(pending)))
            out += replies
            pending -= {m.metadata.reply_to_message_id for m in replies}
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(self.poll)
        return out


def secure_sum(
    grid: Grid,
    context: Context,
    nodes: Mapping[int, str],
    length: int,
    *,
    threshold: int,
    timeout: float,
    poll: float = 0.2,
) -> tuple[np.ndarray, list[str]]:
    """One SecAgg+ fit round over ``nodes`` (node id -> site id): the sum of the sites'
    encoded vectors (decoded, :func:`decode_sum` needs it) and the sites in it, sorted.

    Every site shares its keys with every other (SecAgg+ with one neighbourhood);
    ``threshold`` sites must stay to unmask. Raises :class:`FederationError` naming the
    sites that dropped out when the sum cannot be unmasked.
    """
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    from distrank.flower.server import FederationError

    strategy = _SumStrategy(list(nodes), length)
    legacy = LegacyContext(context, strategy=strategy)
    legacy.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
    legacy.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    workflow = _Workflow(
        1.0,  # shares: every site
        threshold,
        max_weight=1.0,  # each site's FitRes weighs 1: the factor Flower divides by is k
        clipping_range=1.0,
        quantization_range=LEVELS,
        modulus_range=MODULUS,
        timeout=timeout,
    )
    workflow(_PollingGrid(grid, poll), legacy)
    if strategy.results is None:
        stage, _, sampled, active, failures = workflow.trace[-1]
        gone = sorted(nodes[n] for n in sampled - active) or sorted(nodes.values())
        raise FederationError(
            f"secure sum halted at the {stage!r} stage: site(s) {gone} dropped out (no reply "
            f"within {timeout:g} s{': ' + '; '.join(failures) if failures else ''}), and "
            f"unmasking needs {threshold} of the {len(nodes)} sites (run config "
            "'secure-threshold')"
        )
    included = sorted(nodes[proxy.node_id] for proxy, _ in strategy.results)
    (mean,) = parameters_to_ndarrays(strategy.results[0][1].parameters)
    return mean, included


def decode_sum(mean: np.ndarray, k: int, plan: Plan) -> np.ndarray:
    """The summed float64 vector from Flower's aggregate of k sites' limbs.

    Flower hands over (sum z 2^-29 - k) / k; the integer sums of z come back exactly
    (float error < 2^-20 of a unit) and recombine to sum_i rint(v_i 2^59 / s) 2^-59 s.
    """
    from distrank.flower.server import FederationError

    z = (mean * k + k) * 2.0 ** (LIMB - 1)
    sums = np.rint(z)
    if np.abs(z - sums).max(initial=0.0) > 0.25:
        raise FederationError(
            "secure sum: the aggregate is not an integer vector (Flower changed?)"
        )
    half = sums.shape[0] // 2
    hi, lo = sums[:half].astype(np.int64), sums[half:].astype(np.int64)
    grid = (hi - k * (HALF >> LIMB)).astype(np.float64) * 2.0 ** (LIMB - 2 * LIMB + 1)
    grid = grid + lo.astype(np.float64) * 2.0 ** (1 - 2 * LIMB)
    return grid * _entry_scales(plan)


def secure_table(
    mean: np.ndarray, k: int, plan: Plan, models: Mapping, centre: np.ndarray, *, device=None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tidy table (avg rows of KD and Recall, all rows of FD) and the bound of each row
    (columns model, metric, aggregation, bound) from Flower's aggregate of k sites."""
    import pandas as pd

    from distrank.metrics.fd import GaussianStats, frechet_distances, gaussian_stats
    from distrank.metrics.table import COLUMNS

    total = decode_sum(mean, k, plan)
    blocks, scales = _split(total, plan), plan.scales()
    n = int(round(blocks["rows"][0]))
    weight = n if plan.weights == "size" else k
    values, bound = {}, {}
    for metric in plan.metrics:
        values[metric] = blocks[metric] / weight
        bound[metric] = np.full(len(plan.models), k * scales[metric] * SUM_ERROR / weight)
    if plan.fd:
        s1, upper = blocks["sum"], blocks["scatter"]
        s2 = np.zeros((plan.dim, plan.dim))
        s2[np.triu_indices(plan.dim)] = upper
        s2 = s2 + s2.T - np.diag(np.diag(s2))
        cov = (s2 - np.outer(s1, s1) / n) / (n - 1)
        pooled = GaussianStats(n, np.asarray(centre) + s1 / n, cov)
        fitted = [gaussian_stats(models[name], device=device) for name in plan.models]
        values["fd"] = frechet_distances([pooled], fitted, device=device)[0]
        e1, e2 = (k * scales[b] * SUM_ERROR for b in ("sum", "scatter"))
        bound["fd"] = np.array([fd_bound(pooled, y, s1, e1, e2) for y in fitted])
    rows, bound_rows = [], []
    for i, model in enumerate(plan.models):
        for metric in SECURE_METRICS:
            if metric in values:
                agg = "all" if metric == "fd" else "avg"
                rows.append((model, metric, agg, "", float(values[metric][i])))
                bound_rows.append((model, metric, agg, float(bound[metric][i])))
    bounds = pd.DataFrame(bound_rows, columns=["model", "metric", "aggregation", "bound"])
    return pd.DataFrame(rows, columns=COLUMNS), bounds


def fd_bound(pooled, model, s1: np.ndarray, e1: float, e2: float) -> float:
    """A bound on |FD(pooled) - FD(exact pooled statistics)| when every entry of S1 is off by
    at most e1 and every entry of S2 by at most e2 (FD's own rounding aside).

    The mean moves by |dm| <= sqrt(d) e1 / n, every covariance entry by at most
    ec = (e2 + (2 e1 (max|S1| + e1) + e1^2) / n) / (n - 1), so |dC|_F <= d ec and the trace
    norm |dC|_1 <= d^1.5 ec. Then |d |m - m_Y|^2| <= 2 |m - m_Y| |dm| + 3 |dm|^2,
    |d tr C| <= d ec, and tr (C^1/2 C_Y C^1/2)^1/2 = |C^1/2 C_Y^1/2|_1 (trace norm) moves
    by at most |C'^1/2 - C^1/2|_F |C_Y^1/2|_F, where |C'^1/2 - C^1/2|_F is at most
    sqrt(2 |dC|_1) (Powers-Stormer, |A^1/2 - B^1/2|_F^2 <= |A - B|_1 for positive
    semi-definite A, B; the 2 covers FD's dropping of C''s negative part, of trace norm
    <= |dC|_1) and, when C is positive definite, |dC|_F / sqrt(lambda_min(C)).
    """
    n, d = pooled.n, pooled.mean.shape[0]
    dm = math.sqrt(d) * e1 / n
    ec = (e2 + (2 * e1 * (float(np.abs(s1).max()) + e1) + e1 * e1) / n) / (n - 1)
    gap = float(np.linalg.norm(pooled.mean - model.mean))
    spread = math.sqrt(max(float(np.trace(model.cov)), 0.0))
    root = math.sqrt(2 * d**1.5 * ec) * spread
    smallest = float(np.linalg.eigvalsh(pooled.cov)[0]) - d * ec  # <= lambda_min(C)
    if smallest > 0:
        root = min(root, d * ec / math.sqrt(smallest) * spread)
    return 2 * gap * dm + 3 * dm * dm + d * ec + 2 * root


def _entry_scales(plan: Plan) -> np.ndarray:
    scales = plan.scales()
    return np.concatenate([np.full(length, scales[name]) for name, length, _, _ in plan.blocks()])


def _block_of(plan: Plan, index: int) -> tuple[str, int, float, str]:
    for block in plan.blocks():
        if index < block[1]:
            return block
        index -= block[1]
    raise IndexError(index)


def _split(vector: np.ndarray, plan: Plan) -> dict[str, np.ndarray]:
    out, start = {}, 0
    for name, length, _, _ in plan.blocks():
        out[name] = vector[start : start + length]
        start += length
    return out
