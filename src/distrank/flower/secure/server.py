"""The server in secure mode: round 1, one SecAgg+ fit round, and the table from the sum.

Beside the table it writes ``<out>.meta.json`` (the options, the sites whose vectors
the sum covers and those that dropped, the threshold, the mask generator, and what each
site attested: the noise it added and the policy it applied, signed) and ``<stem>.bounds.csv`` (each number's bound against what
plain mode computes from the same site values, and its noise std).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common import FitIns, Parameters, log, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from flwr.server.workflow import SecAggPlusWorkflow

from distrank.flower.federation import FederationError, RunSettings, gather
from distrank.flower.masks import GENERATOR
from distrank.flower.secure.plan import (
    KEYS,
    LEVELS,
    MODULUS,
    SIGNED,
    SUM_ERROR,
    VIEWS,
    Plan,
    SecureSettings,
    decode,
    decode_ready,
    encode_secure_request,
    make_plan,
    public_centre,
    split,
)
from distrank.metrics._registry import METRICS

if TYPE_CHECKING:
    import pandas as pd
    from flwr.serverapp import Grid


def main(grid: Grid, context: Context) -> None:
    """Secure mode's ServerApp body: the table (its metadata and bounds) from the secure sum."""
    from distrank._io import atomic_path
    from distrank.features.cache import load_features
    from distrank.metrics._table import write

    settings = RunSettings.from_run_config(context.run_config)
    secure = SecureSettings.from_run_config(context.run_config, settings)
    models = {name: load_features(path) for name, path in settings.models.items()}
    plan = make_plan(settings, secure, models)
    centre = public_centre(models)
    sent = {m: models[m] for m in plan.models}  # none for a sketch
    ready = gather(
        grid,
        encode_secure_request(sent, settings.options, plan, centre),
        sites=settings.sites,
        timeout=settings.timeout,
        decode=decode_ready,
    )
    if plan.moments and (without := [r.site for r in ready if not r.moments]):
        raise FederationError(
            f"metrics {list(plan.moments)} need every site's moments in the secure sum; "
            f"site(s) {without} do not allow it (node config share-stats=false): drop "
            f"{list(plan.moments)} from 'metrics'"
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
    attested = {str(r.site): r for r in ready if str(r.site) in included}
    noise = summed_noise(r.attested for r in attested.values())
    table, bounds = secure_table(total, len(included), plan, models, centre, noise=noise)
    meta = secure_meta(settings, secure, included, attested, noise)
    with atomic_path(bounds_path(settings.out)) as tmp:
        bounds.to_csv(tmp, index=False)
    if any(not METRICS[m].needs_models for m in plan.metrics):  # a pooled sketch: later models too
        pooled = write_pooled_sketch(total, len(included), plan, noise, sketch_path(settings.out))
        table = pooled_confidence(table, pooled, models, plan, meta)
    write(table, settings.out, meta, "csv")
    if "confidence" in meta:
        from distrank.metrics.sketch._confidence import write_confidence

        write_confidence(meta, settings.out)
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
            meta=meta,
            title="Consistency report: federated evaluation, secure sum",
            source=settings.out,
        )


def summed_noise(attested) -> dict[str, float]:
    """Block -> the std of the noise in the sum, from what the sites in it attested:
    sqrt(sum_i std_i^2) ({} when no site added any)."""
    total: dict[str, float] = {}
    for content in attested:
        for block, std in dict(content.get("noise") or {}).items():
            total[block] = total.get(block, 0.0) + float(std) ** 2
    return {block: var**0.5 for block, var in total.items() if var > 0}


def secure_meta(
    settings: RunSettings,
    secure: SecureSettings,
    included: Sequence[str],
    attested: Mapping | None = None,
    noise: Mapping[str, float] | None = None,
) -> dict:
    """The table's metadata: options, the sites its sums cover, what each site in the sum
    attested (the noise it added, the policy it applied, the epsilon it spent; with its
    signed statement, which anyone holding the members' pinned keys can check:
    ``identity.verify_attestation``) and the noise in the sums. It claims no privacy the
    sites did not attest: ``privacy.noise`` is "none" when no site added noise."""
    import base64

    sites = {}
    for name, ready in (attested or {}).items():
        sites[name] = dict(ready.attested)
        if ready.signed:
            sites[name]["signed"] = [base64.b64encode(bytes(b)).decode() for b in ready.signed]
    requested = {"epsilon": secure.epsilon, "delta": secure.delta} if secure.epsilon else "none"
    return {
        "options": settings.score_options.as_dict(),
        "secure": {
            "sites": list(included),
            "dropped": [s for s in settings.sites if s not in included],
            "threshold": secure.threshold,
            "generator": GENERATOR,
            "feature-bound": secure.feature_bound,
            "max-rows": secure.max_rows,
            "attested": sites,
        },
        "privacy": {
            "requested": requested,
            "noise": dict(noise) if noise else "none",
            "sites": {s: guarantee(a) for s, a in sites.items()},
        },
    }


def guarantee(attested: Mapping) -> str:
    """One site's guarantee in words, from what it attested."""
    if not attested.get("noise"):
        return "no noise"
    return (
        f"(epsilon {attested['noise-epsilon']:g}, delta {attested['noise-delta']:g}) per "
        f"release for one row, with up to {attested['colluders']} colluding sites"
    )


def sketch_path(out):
    """Where secure mode's pooled sketch goes: ``scores.csv`` -> ``scores.sketch.npz``."""
    return out.with_name(f"{out.stem}.sketch.npz")


def write_pooled_sketch(mean, k: int, plan: Plan, noise: Mapping[str, float], path):
    """The pooled sketch of a secure sum, its noise std per entry in its metadata
    (``distrank rank --sketch`` scores models from it later); returns it."""
    from distrank.metrics.sketch._family import pooled_sketch
    from distrank.metrics.sketch._maps import Sketch, save

    blocks = split(decode(mean, k, plan), plan)
    n = int(round(blocks["rows"][0]))
    pooled = pooled_sketch(plan, blocks, n)
    if noise.get("sketch"):
        pooled = Sketch(pooled.mean, n, pooled.meta | {"noise_std": noise["sketch"] / n})
    save(path, pooled)
    return pooled


def pooled_confidence(table, pooled, models: Mapping, plan: Plan, meta: dict):
    """The table with ``kd_sketch``'s values unbiased (the pooled sketch's noise excess
    removed), and in ``meta`` the raw values and the confidence of its ranking
    (``metrics.sketch._confidence``)."""
    from distrank.metrics.sketch._confidence import ranking_confidence
    from distrank.metrics.sketch._family import plan_map
    from distrank.metrics.sketch._maps import bias

    rows = table.metric == "kd_sketch"
    excess = bias(pooled.n, pooled.meta["dim"], pooled.noise_std)
    raw = table[rows][["model", "aggregation", "value"]].to_dict(orient="records")
    table = table.assign(value=table.value.where(~rows, table.value - excess))
    fmap = plan_map(plan)
    t = {name: fmap.sketch(np.asarray(y)).mean for name, y in models.items()}
    conf = ranking_confidence(pooled, t, table)
    meta["sketch"] = {"raw": raw, "bias_removed": excess, "pooled_noise_std": pooled.noise_std}
    meta["confidence"] = conf | {"pairs": conf["pairs"].to_dict(orient="records")}
    return table


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


class _SecureGrid:
    """The grid, with ``send_and_receive`` polling every ``poll`` s (Flower's polls every 3 s)
    and carrying the sites' signed statements: each site's signed keys (from its setup
    reply) to every site with the share-keys request, and each site's signed view (from
    its masked-vector reply) with the unmask request (``secure.site.policy_mod``)."""

    def __init__(self, grid: Grid, poll: float):
        self.grid, self.poll = grid, poll
        self.signed: dict[str, dict[str, list]] = {
            Stage.SETUP: {},
            Stage.COLLECT_MASKED_VECTORS: {},
        }

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        stage = (
            messages[0].content.config_records[RECORD_KEY_CONFIGS][Key.STAGE] if messages else ""
        )
        forward = {
            Stage.SHARE_KEYS: (KEYS, Stage.SETUP),
            Stage.UNMASK: (VIEWS, Stage.COLLECT_MASKED_VECTORS),
        }
        if stage in forward:
            name, source = forward[stage]
            for msg in messages:
                msg.content.config_records[name] = ConfigRecord(dict(self.signed[source]))
        replies = self._send_and_receive(messages, timeout)
        for reply in replies:
            if (
                stage in self.signed
                and not reply.has_error()
                and SIGNED in reply.content.config_records
            ):
                signed = reply.content.config_records[SIGNED]["signed"]
                self.signed[stage][str(reply.metadata.src_node_id)] = signed
        return replies

    def _send_and_receive(self, messages, timeout):
        pending = set(self.grid.push_messages(messages))
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
    encoded vectors (decoded, :func:`~distrank.flower.secure.plan.decode` needs it) and
    the sites in it, sorted: those whose masked vectors arrived.

    Every site shares its keys with every other (SecAgg+ with one neighbourhood);
    ``threshold`` sites must stay to unmask. Raises :class:`FederationError` naming the
    sites that dropped out when the sum cannot be unmasked.
    """
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

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
    workflow(_SecureGrid(grid, poll), legacy)
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


def secure_table(
    mean: np.ndarray,
    k: int,
    plan: Plan,
    models: Mapping,
    centre: np.ndarray,
    *,
    noise: Mapping[str, float] | None = None,
    device=None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tidy table (each metric's rows of its secure sum: avg of KD and Recall, all of
    FD) and the bound and noise std of each row (columns model, metric, aggregation,
    bound, noise_std) from Flower's aggregate of k sites; ``noise``: block -> the std of
    the noise the sites attested in its sum (:func:`summed_noise`)."""
    import pandas as pd

    from distrank.metrics._table import from_values

    try:
        total = decode(mean, k, plan)
    except ValueError as err:
        raise FederationError(str(err)) from None
    blocks, scales = split(total, plan), plan.scales()
    errors = {name: k * s * SUM_ERROR for name, s in scales.items()}  # per summed entry
    n = int(round(blocks["rows"][0]))
    names = plan.models or tuple(models)  # a sketch's plan has no model: the server's
    scored = {g: models[g] for g in names}
    values: dict = {g: {} for g in names}
    bounds = {}  # (model, metric, aggregation) -> (bound, noise std)
    for metric, secure in plan.sums().items():
        std = (noise or {}).get(secure.blocks(plan)[0][0], 0.0)
        noise_std = secure.value_noise(plan, scored, std, n, k) if std else np.zeros(len(names))
        got = secure.finish(plan, blocks, n, k, centre, scored, errors, device=device)
        for i, model in enumerate(names):
            pooled, avg = (got[a][0][i] if a in got else None for a in ("all", "avg"))
            values[model][metric] = (pooled, (), avg)
            for agg, (_, bound) in got.items():
                bounds[(model, metric, agg)] = (float(bound[i]), float(noise_std[i]))
    table = from_values(values)
    keys = zip(table.model, table.metric, table.aggregation)
    columns = ["model", "metric", "aggregation", "bound", "noise_std"]
    return table, pd.DataFrame([(*key, *bounds[key]) for key in keys], columns=columns)
