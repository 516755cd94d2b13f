"""The site: a Flower ``ClientApp`` that scores every model on the site's own features.

A site never sends features, and releases only what its release policy
(:mod:`distrank.flower.policy`) opens, with the noise that policy asks for, accounted
in its ledger. Plain scores (policy ``plain = "scores"``): per model, its client
scores D(X_i, Y) from :func:`distrank.metrics.score_client` (equal to the ``client``
rows of ``distrank score`` for this site, without noise), its row count n_i and its
site id; and, only with ``share-stats = true`` and no noise, the statistics of each
requested metric that has them (``Metric.pooled``: FD's Gaussian statistics (n_i,
mean_i, C_i), from which the server pools FD_all exactly). Plain sketches (``plain =
"sketch"``): its mean sketch of the request's public map. Each reply carries what the
site attests (the noise it added and the policy it applied). In secure mode
(:mod:`distrank.flower.secure`) the site prepares its vector on the request and sends
it, masked, in a SecAgg+ round. It answers no message type but ``query`` and ``train``.
Node config: :mod:`distrank.flower.node`.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from distrank.flower.messages import (
    decode_request,
    encode_error,
    encode_reply,
    encode_sketch_reply,
)
from distrank.flower.node import SiteConfig
from distrank.flower.secure.site import attestation, guard_mod, policy_mod, prepare, share
from distrank.metrics._registry import METRICS

#: the only message types a site answers: Flower routes "train.<action>" and
#: "query.<action>" to the same functions, past mods that act on the exact type only
TYPES = (MessageType.QUERY, MessageType.TRAIN)


def exact_types_mod(msg: Message, context: Context, call_next) -> Message:
    """Refuse every message whose type is not exactly one distrank sends (``TYPES``)."""
    if msg.metadata.message_type not in TYPES:
        return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "refused"), reply_to=msg)
    return call_next(msg, context)


app = ClientApp(mods=[exact_types_mod])


def score_site(site: SiteConfig, request: RecordDict, run: int = 0, node: int = 0) -> RecordDict:
    """The reply content to a plain ``request``: scores (and statistics, if allowed), or
    this site's sketch (sketch mode), each with the noise of its policy and what it
    attests; or the error that prevented them. Every refusal comes from the request and
    the policy, before the data is read (:mod:`distrank.flower.policy`)."""
    from distrank.features.cache import load_features
    from distrank.metrics import score_client

    policy = site.policy
    try:
        models, opts, want_stats, path, sens = check_plain(policy, request)
        stds = policy.stds(sens)
        spent = policy.spend(path=path, run=run, what=opts.metrics)
        x = policy.clip(load_features(site.features))
        rng = np.random.default_rng()
        n = released_rows(len(x), stds, rng)
        said = {"path": path, "noise": stds, "spent": spent} | policy.summary()
        attested = attestation(site, run, node, said)
        if path == "sketch":
            reply = encode_sketch_reply(site.site, site_sketch(x, opts, stds, n, rng))
            reply["attested"] = attested
            return reply
        scores = score_client(x, models, opts, device=site.device)
        for metric, std in stds.items():
            for by_metric in scores.values():
                if metric in by_metric:
                    by_metric[metric] += float(rng.normal(0.0, std))
        stats = None
        if want_stats and policy.share_stats and not stds:  # moments leave only exact
            pooled = {m: METRICS[m].pooled for m in opts.metrics}
            stats = {m: p.site(x, site.device) for m, p in pooled.items() if p is not None}
    except (ValueError, OSError) as err:
        return encode_error(site.site, f"{type(err).__name__}: {err}")
    reply = encode_reply(site.site, n, scores, stats)
    reply["attested"] = attested
    return reply


def check_plain(policy, request: RecordDict):
    """(models, options, want_stats, path, block -> sensitivity ({} without noise)) of a
    plain request, from the request and the policy only; Refused or ValueError."""
    from distrank.metrics._options import score_options
    from distrank.metrics._registry import models_free
    from distrank.metrics.sketch._family import SketchSum

    models, options, want_stats = decode_request(request)
    opts = score_options(options)
    sketching = models_free(opts.metrics) and not models  # sketch mode
    path = "sketch" if sketching else "scores"
    policy.allow(path, opts.metrics)
    if sketching and (opts.kernel != "rbf" or "bandwidth" not in (opts.kernel_params or {})):
        raise ValueError("sketch mode: needs kernel rbf and a public 'bandwidth' (kernel-params)")
    dim = next(iter(models.values())).shape[1] if models else 1
    bounds = policy.bounds(opts, dim, models)
    if not policy.noisy:
        sens = {}
    elif sketching:
        sens = SketchSum().sensitivity(None, bounds, opts)
    else:
        sens = plain_sensitivities(opts, bounds, models)
    return models, opts, want_stats, path, sens


def plain_sensitivities(opts, bounds, models) -> dict:
    """Metric -> the L2 sensitivity of this site's plain scores of every model (its
    ``WeightedSum`` under uniform weights: D_i moves by the unit over ``min-rows``);
    None for a metric with no such bound."""
    from types import SimpleNamespace

    one_site = SimpleNamespace(models=tuple(models), weights="uniform")
    out = {}
    for m in opts.metrics:
        secure = METRICS[m].secure
        scored = secure is not None and secure.needs_scores
        out[m] = secure.sensitivity(one_site, bounds, opts)[m] if scored else None
    return out


def released_rows(n: int, stds, rng) -> int:
    """n_i as it leaves: exact, or with the policy's noise (rounded, at least 1)."""
    if "rows" not in stds:
        return n
    return max(1, int(round(n + rng.normal(0.0, stds["rows"]))))


def site_sketch(x, opts, stds, n: int, rng):
    """Sketch mode: this site's mean sketch of the request's public map, released as the
    noised sum n_i s_i (sensitivity 2) over the released n."""
    from distrank.metrics.sketch._family import feature_map
    from distrank.metrics.sketch._maps import Sketch

    made = feature_map(opts, x.shape[1]).sketch(x)
    if not stds:
        return made
    total = made.n * np.asarray(made.mean) + rng.normal(0.0, stds["sketch"], np.shape(made.mean))
    meta = dict(made.meta) | {"noise_std": stds["sketch"] / n}
    return Sketch(total / n, n, meta)


@app.query(mods=[guard_mod])
def query(msg: Message, context: Context) -> Message:
    """Answer the server's request with this site's scores (in secure mode: prepare them).
    What the site cannot answer leaves as a failure category (``secure.site.guard_mod``)."""
    site = SiteConfig.from_node_config(context.node_config)
    if "secure" in msg.content.config_records:
        return Message(prepare(site, msg.content, context), reply_to=msg)
    return Message(score_site(site, msg.content, context.run_id, context.node_id), reply_to=msg)


@app.train(mods=[guard_mod, policy_mod, secaggplus_mod])
def train(msg: Message, context: Context) -> Message:
    """Secure mode's SecAgg+ round: ``secaggplus_mod`` runs its stages and masks the
    vector this site prepared; the site's policy checks each stage first, and a failure
    leaves as its category only (:mod:`distrank.flower.secure.site`)."""
    site = SiteConfig.from_node_config(context.node_config)
    return Message(share(site.site, msg, context.state), reply_to=msg)
