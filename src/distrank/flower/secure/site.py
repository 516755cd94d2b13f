"""A site in secure mode: its vector, its policy, and failures that say nothing about it.

What leaves a site (node config: :mod:`distrank.flower.node`):

    round 1         its id, whether it joins FD, or a failure category
    SecAgg+ stages  what Flower's ``secaggplus_mod`` sends -- public keys, encrypted key
                    shares, the masked vector, the shares for unmasking -- once this
                    site's policy (:func:`policy_mod`) allows the stage
    a failure       one of :data:`CATEGORIES`; the full message stays in the site's log

The policy: the request names this site's mask generator (``masks.GENERATOR``); the
run has at least ``min-sites`` sites and its threshold is a majority of them (so that
no server gathers both a site's private-seed shares and its key shares from disjoint
sets of sites); at unmasking, the active and dropped lists are disjoint and the active
sites, whose sum is unmasked, number at least ``min-sites``.
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Error, Message, MessageType, RecordDict
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
from distrank.flower.messages import decode_request
from distrank.flower.node import SiteConfig
from distrank.flower.secure.plan import OutOfBounds, Plan, encode, encode_ready, split

STATE = "distrank.secure"  # the site's context.state record of its prepared vector
#: what a site in secure mode says of a failure, whatever its cause
CATEGORIES = ("bad input", "too few rows", "out of bounds", "refused", "internal")


class Refused(ValueError):
    """A request that this site's policy refuses."""


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
    scores = score_client(x, models, device=device, **(dict(options) | {"metrics": scored}))
    parts = [np.array([n], np.float64)]
    for secure in sums.values():
        parts += secure.site(plan, x, scores if scored else None, centre, device=device)
    return np.concatenate(parts)


def add_noise(vector: np.ndarray, plan: Plan, rng: np.random.Generator) -> np.ndarray:
    """The vector with N(0, ``plan.noise_std``^2) added to each entry of a noisy block."""
    if not plan.noise_std:
        return vector
    noisy, blocks = vector.copy(), split(np.arange(len(vector)), plan)
    for secure in plan.sums().values():
        for name, length, _ in secure.blocks(plan) if secure.noisy else ():
            noisy[blocks[name]] += rng.normal(0.0, plan.noise_std, length)
    return noisy


def prepare(site: SiteConfig, content: RecordDict, state: RecordDict) -> RecordDict:
    """Round 1 at a site: compute, check and keep its encoded vector in ``state`` (it
    stays on the site); reply only the site id, whether it adds its moments, or a category."""
    from distrank.features.cache import load_features

    try:
        models, options, _ = decode_request(content)
        if "secure" not in content.config_records or "centre" not in content.array_records:
            raise ValueError("secure request: no plan")
        plan = Plan.from_config(content.config_records["secure"])
        if plan.generator != masks.GENERATOR or not masks.installed():
            raise Refused(
                f"the request's masks come from {plan.generator!r}; this site's from "
                f"{masks.GENERATOR!r} (installed: {masks.installed()})"
            )
        if plan.moments and not site.share_stats:
            return encode_ready(site.site, moments=False)
        centre = content.array_records["centre"]["c"].numpy()
        x = load_features(site.features)
        vector = site_vector(x, models, options, plan, centre, site.device)
        limbs = encode(add_noise(vector, plan, np.random.default_rng()), plan)
    except Exception as err:  # noqa: BLE001 -- every failure leaves as its category only
        return encode_ready(site.site, error=failure(err))
    state[STATE] = ArrayRecord({"limbs": Array(limbs)})
    return encode_ready(site.site, moments=bool(plan.moments))


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


# -- Flower mods around secaggplus_mod ---------------------------------------------------


def guard_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Every failure of the mods and app inside leaves as its category only."""
    try:
        return call_next(msg, context)
    except Exception as err:  # noqa: BLE001
        error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=failure(err))
        return Message(error, reply_to=msg)


def policy_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """This site's policy on the SecAgg+ stages (module doc), checked before
    ``secaggplus_mod`` answers them."""
    if msg.metadata.message_type == MessageType.TRAIN:
        configs = msg.content.config_records[RECORD_KEY_CONFIGS]
        site = SiteConfig.from_node_config(context.node_config)
        if configs.get(Key.STAGE) == Stage.SHARE_KEYS:
            state = SecAggPlusState(**context.state.config_records[RECORD_KEY_STATE])
            check_sites(len(configs) - 1, state.threshold, site.min_sites)
        elif configs.get(Key.STAGE) == Stage.UNMASK:
            check_unmask(
                configs[Key.ACTIVE_NODE_ID_LIST], configs[Key.DEAD_NODE_ID_LIST], site.min_sites
            )
    return call_next(msg, context)


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
