"""A site in secure mode: its vector, its policy, and failures that say nothing about it.

What leaves a site (node config and release policy: :mod:`distrank.flower.node`,
:mod:`distrank.flower.policy`):

    round 1         its id, whether it joins FD, what it attests (the noise it added,
                    the policy it applied, signed), or a failure category -- once per
                    run: a second query is refused
    SecAgg+ stages  what Flower's ``secaggplus_mod`` sends -- public keys (signed with
                    the site's long-term key), encrypted key shares, the masked vector
                    (with the signed set of peers it masked with), the shares for
                    unmasking -- once this site's policy (:func:`policy_mod`) allows the stage
    a failure       one of :data:`CATEGORIES`; the full message stays in the site's log

Before it reads its data, the site checks the request against its own policy
(:func:`check_plan`): it derives each block's sensitivity and its own noise from the
request's kernel, estimator and weights and its own bounds, and refuses what its policy
does not open; its rows are then clipped to its bounds inside the release, so no answer
depends on the data. The protocol checks: the request names this site's mask generator;
the run has at least ``min-sites`` sites and a threshold that is a majority of them and
the plan's; every peer's SecAgg+ keys are signed by a pinned site, each site once
(:func:`check_keys`); at unmasking, the active and dropped nodes are exactly the peers
this site masked with, every active site masked with the same peers (their signed
views, :func:`check_views`), and they number at least the threshold and ``min-sites``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from logging import WARNING

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    RecordDict,
)
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Code, FitRes, Status, log, ndarrays_to_parameters
from flwr.common.constant import ErrorCode
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    Key,
    Stage,
)
from flwr.compat.common import recorddict_compat as compat

from distrank._checks import TooFewRows
from distrank.flower import masks
from distrank.flower.identity import BadStatement, Identity, Statement, keys_content
from distrank.flower.messages import decode_request
from distrank.flower.node import SiteConfig
from distrank.flower.policy import Policy, Refused
from distrank.flower.secure.plan import (
    KEYS,
    SIGNED,
    VIEWS,
    OutOfBounds,
    Plan,
    encode,
    encode_ready,
    entry_scales,
    split,
)

STATE = "distrank.secure"  # the site's context.state record of its prepared vector
RUN = "distrank.run"  # the context.state record of the run this site answered, and its plan
#: what a site in secure mode says of a failure, whatever its cause
CATEGORIES = ("bad input", "too few rows", "out of bounds", "refused", "internal")


def category(err: BaseException) -> str:
    """The failure category of an exception: never its message."""
    if isinstance(err, TooFewRows):
        return "too few rows"
    if isinstance(err, OutOfBounds):
        return "out of bounds"
    if isinstance(err, Refused):
        return "refused"
    if isinstance(err, (ValueError, KeyError, TypeError, OSError)):
        return "bad input"
    return "internal"


def failure(err: BaseException) -> str:
    """Log ``err`` in full here, at the site; return only its category."""
    kind = category(err)
    log(WARNING, "distrank: secure mode, %s: %s: %s", kind, type(err).__name__, err)
    return kind


def site_vector(
    x: np.ndarray, models: Mapping, options: Mapping, plan: Plan, centre, device=None
) -> np.ndarray:
    """A site's float64 vector in the plan's layout -- n_i, then each metric's entries
    (``Metric.secure``) -- after checking its rows against the plan's public bounds
    (:class:`OutOfBounds` names the setting to raise)."""
    from distrank.metrics import score_client

    n = len(x)
    if n > plan.max_rows:
        raise OutOfBounds(
            f"this site has {n} rows, above the run config's 'max-rows' {plan.max_rows}"
        )
    norms = np.linalg.norm(np.asarray(x, np.float64), axis=1)
    if not np.all(norms <= plan.feature_bound):
        raise OutOfBounds(
            f"a row of this site has L2 norm {float(np.max(norms)):g}, above the run config's "
            f"'feature-bound' {plan.feature_bound:g}: raise it"
        )
    sums = plan.sums()
    scored = tuple(m for m, s in sums.items() if s.needs_scores)
    scores = (
        score_client(x, models, device=device, **(dict(options) | {"metrics": scored}))
        if scored
        else None
    )
    parts = [np.array([n], np.float64)]
    for secure in sums.values():
        parts += secure.site(plan, x, scores, centre, device=device)
    return np.concatenate(parts)


def add_noise(
    vector: np.ndarray, plan: Plan, stds: Mapping[str, float], rng: np.random.Generator
) -> np.ndarray:
    """The vector with N(0, ``stds[block]``^2) added to each entry of each block named."""
    if not stds:
        return vector
    noisy, blocks = vector.copy(), split(np.arange(len(vector)), plan)
    for name, std in stds.items():
        noisy[blocks[name]] += rng.normal(0.0, std, len(blocks[name]))
    return noisy


def check_plan(
    policy: Policy, plan: Plan, models: Mapping, options: Mapping, centre
) -> tuple[dict, dict, int]:
    """(the std of the noise this site adds to each block, each block's sensitivity, the
    honest sites t - c whose noise any unmaskable sum holds) of a secure request, or
    Refused. Reads the request and the policy only, never the data:
    the ranges must hold this site's values and noise, the models and the centre must lie
    in its ball, and the noise is its own policy's (``flower.policy``)."""
    from distrank.metrics._options import score_options
    from distrank.metrics._registry import METRICS, uses_kernel

    policy.allow("secure", plan.metrics)
    if not policy.feature_bound:
        raise Refused("this site's policy sets no 'feature-bound'")
    if plan.feature_bound < policy.feature_bound or plan.max_rows < policy.max_rows:
        raise Refused(
            f"the plan's bounds (feature-bound {plan.feature_bound:g}, max-rows "
            f"{plan.max_rows}) are below this site's ({policy.feature_bound:g}, {policy.max_rows})"
        )
    opts = score_options(dict(options) | {"metrics": plan.metrics})
    need = max(METRICS[m].needs(opts).client for m in plan.metrics)
    if need > policy.min_rows:
        raise Refused(f"the request needs {need} rows per site; this site's 'min-rows' is lower")
    if tuple(models) != plan.models:
        raise Refused("the request's models do not match its plan")
    bounds = policy.bounds(opts, plan.dim, models)
    centre = np.asarray(centre)
    if centre.shape != (plan.dim,) or not np.linalg.norm(centre) <= policy.feature_bound:
        raise Refused(
            f"the centre is no point of this site's ball (feature-bound {policy.feature_bound:g})"
        )
    own = max(map(abs, bounds.kernel_range))  # its range's power of two has room for rounding
    if uses_kernel(plan.metrics) and plan.kernel_bound < own * (1 - 1e-9):
        raise Refused(f"the plan's kernel bound {plan.kernel_bound:g} is below this site's")
    sens, share = plan.sensitivities(bounds, opts), policy.share(plan.threshold)
    stds = policy.stds(sens, share=share) if policy.noisy else {}
    room = dict(plan.room)
    if narrow := [b for b, std in stds.items() if std > room.get(b, 0.0) * (1 + 1e-9)]:
        raise Refused(f"the plan's ranges of blocks {narrow} hold less noise than this site adds")
    return stds, sens, share


def clip_to_ranges(vector: np.ndarray, plan: Plan) -> np.ndarray:
    """Each entry within its block's range (a value never leaves it: rows are clipped and
    the ranges hold 40 noise stds; this keeps even that tail from failing the release)."""
    scales = entry_scales(plan)
    return np.clip(vector, -scales, scales)


def attestation(site: SiteConfig, run: int, node: int, content: Mapping) -> ConfigRecord:
    """What the site attests with its reply: the noise it added (block -> std, {} for
    none), the policy it applied and the epsilon spent; signed with its long-term key
    when it has one (``identity.Statement`` of kind "attest")."""
    text = json.dumps(dict(content), sort_keys=True)
    record = {"content": text}
    if site.signing_key is not None and site.peers is not None:
        identity = Identity.load(site.site, site.signing_key, site.peers)
        said = Statement("attest", run, node, identity.site, (text,))
        record["signed"] = identity.sign(said)
    return ConfigRecord(record)


def prepare(site: SiteConfig, content: RecordDict, context: Context) -> RecordDict:
    """Round 1 at a site: check the request, then compute, check and keep its encoded
    vector in ``context.state`` (it stays on the site); reply only the site id, whether
    it adds its moments and what it attests, or a category."""
    from distrank.features.cache import load_features

    state, policy = context.state, site.policy
    try:
        if (done := state.config_records.get(RUN)) and done["run"] == context.run_id:
            raise Refused(f"a second round-one query in run {context.run_id}")
        state.config_records[RUN] = ConfigRecord({"run": context.run_id})
        if site.signing_key is None or site.peers is None:
            raise Refused("secure mode needs 'signing-key' and 'peers' in the node config")
        Identity.load(site.site, site.signing_key, site.peers)
        models, options, _ = decode_request(content)
        if "secure" not in content.config_records or "centre" not in content.array_records:
            raise ValueError("secure request: no plan")
        plan = Plan.from_config(content.config_records["secure"])
        if plan.generator != masks.GENERATOR or not masks.installed():
            raise Refused(
                f"the request's masks come from {plan.generator!r}; this site's from "
                f"{masks.GENERATOR!r} (installed: {masks.installed()})"
            )
        centre = content.array_records["centre"]["c"].numpy()
        stds, _, _ = check_plan(policy, plan, models, options, centre)
        if plan.moments and not policy.share_stats:
            return encode_ready(site.site, moments=False)
        x = policy.clip(load_features(site.features))
        vector = site_vector(x, models, options, plan, centre, site.device)
        limbs = encode(
            clip_to_ranges(add_noise(vector, plan, stds, np.random.default_rng()), plan), plan
        )
        spent = policy.spend(path="secure", run=context.run_id, what=plan.metrics)
        said = {"path": "secure", "noise": stds, "threshold": plan.threshold, "spent": spent}
        attested = attestation(site, context.run_id, context.node_id, said | policy.summary())
    except Exception as err:  # noqa: BLE001 -- every failure leaves as its category only
        return encode_ready(site.site, error=failure(err))
    state[STATE] = ArrayRecord({"limbs": Array(limbs)})
    state.config_records[RUN]["threshold"] = plan.threshold
    return encode_ready(site.site, moments=bool(plan.moments), attested=attested)


def share(site_id, msg: Message, state: RecordDict) -> RecordDict:
    """SecAgg+ stage 2 at a site: its prepared vector as a FitRes, which ``secaggplus_mod``
    quantises and masks; only from inside that stage (the message type ``train`` and
    the SecAgg+ state after its key shares), once. The FitRes metrics hold the site id."""
    secagg = state.config_records.get(RECORD_KEY_STATE, {})
    if msg.metadata.message_type != MessageType.TRAIN or secagg.get("current_stage") != (
        Stage.SHARE_KEYS
    ):
        raise Refused("the prepared vector leaves only inside SecAgg+'s masked-vector stage")
    if STATE not in state.array_records:
        raise ValueError("secure mode: no prepared vector at this site for this run")
    limbs = state.array_records.pop(STATE)["limbs"].numpy()
    config = compat.recorddict_to_fitins(msg.content, keep_input=True).config
    if config.get("length") != limbs.shape[0]:
        raise ValueError(f"secure mode: the server expects {config.get('length')} entries")
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([limbs]), 1, {"site-id": site_id})
    return compat.fitres_to_recorddict(res, keep_input=False)


# -- Flower mods around secaggplus_mod ---------------------------------------------------


def guard_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Every failure of the mods and app inside leaves as its category only."""
    try:
        return call_next(msg, context)
    except Exception as err:  # noqa: BLE001
        error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=failure(err))
        return Message(error, reply_to=msg)


def policy_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """This site's policy on the SecAgg+ stages (module doc): the checks before
    ``secaggplus_mod`` answers a stage, and the signed statements added to its replies."""
    configs = msg.content.config_records[RECORD_KEY_CONFIGS]
    stage = configs.get(Key.STAGE)
    site = SiteConfig.from_node_config(context.node_config)
    run = context.state.config_records.get(RUN)
    if run is None or run["run"] != context.run_id or "threshold" not in run:
        raise Refused("SecAgg+ before this site prepared its vector in this run")
    identity = Identity.load(site.site, site.signing_key, site.peers)
    state = SecAggPlusState(**context.state.config_records.get(RECORD_KEY_STATE, {}))
    if stage == Stage.SHARE_KEYS:
        check_sites(len(configs) - 1, state.threshold, site.policy.min_sites)
        if state.threshold != run["threshold"]:
            raise Refused(f"SecAgg+'s threshold {state.threshold} is not the plan's")
        check_keys(identity, configs, msg.content.config_records.get(KEYS, {}), context.run_id)
    elif stage == Stage.UNMASK:
        least = max(run["threshold"], site.policy.min_sites)
        check_unmask(configs[Key.ACTIVE_NODE_ID_LIST], configs[Key.DEAD_NODE_ID_LIST], least)
        views = msg.content.config_records.get(VIEWS, {})
        check_views(identity, state, configs, views, context.run_id)
    reply = call_next(msg, context)
    if stage in (Stage.SETUP, Stage.COLLECT_MASKED_VECTORS) and not reply.has_error():
        state = SecAggPlusState(**context.state.config_records[RECORD_KEY_STATE])
        if stage == Stage.SETUP:
            said = Statement(
                "keys", context.run_id, state.nid, identity.site, keys_content(state.pk1, state.pk2)
            )
        else:
            said = Statement("view", context.run_id, state.nid, identity.site, _view(state))
        reply.content.config_records[SIGNED] = ConfigRecord({"signed": identity.sign(said)})
    return reply


def _view(state: SecAggPlusState) -> tuple[int, ...]:
    """The nodes whose key shares this site holds: itself and the peers it masked with."""
    return tuple(sorted(state.rd_seed_share_dict))


def check_keys(identity: Identity, configs: Mapping, signed: Mapping, run: int) -> None:
    """Refused unless every node's SecAgg+ public keys are signed by a pinned site, for
    this run and that node, each site once."""
    sites = {}
    for nid, (pk1, pk2) in ((k, v) for k, v in configs.items() if k != Key.STAGE):
        try:
            said = identity.verify(signed.get(str(nid)), "keys", run, int(nid))
        except BadStatement as err:
            raise Refused(f"SecAgg+ keys: {err}") from None
        if said.content != keys_content(pk1, pk2):
            raise Refused(f"node {nid}: its keys are not the ones {said.site!r} signed")
        sites[said.site] = sites.get(said.site, 0) + 1
    if any(count > 1 for count in sites.values()):
        raise Refused(f"one site signed the keys of several nodes: {sites}")


def check_views(
    identity: Identity, state: SecAggPlusState, configs: Mapping, views: Mapping, run: int
) -> None:
    """Refused unless the active and dropped nodes are exactly the peers this site
    masked with, itself active, and every active node signed that same set."""
    active, dead, mine = (
        configs[Key.ACTIVE_NODE_ID_LIST],
        configs[Key.DEAD_NODE_ID_LIST],
        _view(state),
    )
    if state.nid not in active or tuple(sorted([*active, *dead])) != mine:
        raise Refused(
            f"the unmask request's active {sorted(active)} and dropped {sorted(dead)} nodes "
            f"are not the peers this node ({state.nid}) masked with, {list(mine)}"
        )
    for nid in active:
        try:
            said = identity.verify(views.get(str(nid)), "view", run, int(nid))
        except BadStatement as err:
            raise Refused(f"views: {err}") from None
        if said.content != mine:
            raise Refused(
                f"node {nid} ({said.site!r}) masked with {list(said.content)}, this node with "
                f"{list(mine)}: the server showed the sites different peers"
            )


def check_sites(n_sites: int, threshold: int, min_sites: int) -> None:
    """Refused unless the run's ``n_sites`` are >= ``min_sites`` and ``threshold`` is a
    majority of them."""
    if n_sites < min_sites:
        raise Refused(
            f"the run has {n_sites} sites, fewer than this site's 'min-sites' {min_sites}"
        )
    if 2 * threshold <= n_sites:
        raise Refused(
            f"the threshold {threshold} is no majority of the {n_sites} sites: a server "
            "could gather one site's private-seed and key shares from two halves"
        )


def check_unmask(active: list[int], dead: list[int], min_sites: int) -> None:
    """Refused if the unmask request asks for both shares of a site, or would unmask a
    sum over fewer than ``min_sites`` sites."""
    if set(active) & set(dead) or len(set(active)) != len(active):
        raise Refused(
            f"the unmask request names sites {sorted(set(active) & set(dead))} as both active "
            "and dropped (or one twice): both shares of a site would unmask it alone"
        )
    if len(active) < min_sites:
        raise Refused(
            f"the sum would cover {len(active)} sites, fewer than this site's 'min-sites' "
            f"{min_sites}"
        )
