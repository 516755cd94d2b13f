"""The site: a Flower ``ClientApp`` that scores every model on the site's own features.

A site never sends features. It answers the server's one request with, per model,
its client scores D(X_i, Y) from :func:`distrank.metrics.score_client` (equal to
the ``client`` rows of ``distrank score`` for this site), its row count n_i and
its site id; and, only when its node config says ``share-stats=true``, the
statistics of each requested metric that has them (``Metric.pooled``: FD's Gaussian
statistics (n_i, mean_i, C_i), from which the server pools FD_all exactly). The mean and covariance reveal more
about the site's data than scores do: sharing them is the site's decision. In
secure mode (:mod:`distrank.flower.secure`) the site prepares its vector on the
request and sends it, masked, in a SecAgg+ round; with ``secure-only=true`` (the
default) it answers nothing else, and it answers no message type but ``query`` and
``train``. Node config: :mod:`distrank.flower.node`.
"""

from __future__ import annotations

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
from distrank.flower.secure import site as secure_site

#: the only message types a site answers: Flower routes "train.<action>" and
#: "query.<action>" to the same functions, past mods that act on the exact type only
TYPES = (MessageType.QUERY, MessageType.TRAIN)
#: a secure-only site's answer to a plain request
SECURE_ONLY = "refused: this site answers secure requests only (node config secure-only)"


def exact_types_mod(msg: Message, context: Context, call_next) -> Message:
    """Refuse every message whose type is not exactly one distrank sends (``TYPES``)."""
    if msg.metadata.message_type not in TYPES:
        return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "refused"), reply_to=msg)
    return call_next(msg, context)


app = ClientApp(mods=[exact_types_mod])


def score_site(site: SiteConfig, request: RecordDict, run: int = 0) -> RecordDict:
    """The reply content to ``request``: scores (and statistics, if allowed), or the
    error that prevented them (a bad request, an unreadable file, too few rows)."""
    from distrank.features.cache import load_features
    from distrank.metrics import score_client
    from distrank.metrics.registry import METRICS

    if site.secure_only:
        return encode_error(site.site, SECURE_ONLY)
    try:
        models, options, want_stats = decode_request(request)
        x = load_features(site.features)
        if list(options["metrics"]) == ["kd_sketch"] and not models:  # sketch mode
            return encode_sketch_reply(site.site, site_sketch(site, x, options, run))
        scores = score_client(x, models, options, device=site.device)
        stats = None
        if want_stats and site.share_stats:
            pooled = {m: METRICS[m].pooled for m in options["metrics"]}
            stats = {m: p.site(x, site.device) for m, p in pooled.items() if p is not None}
    except (ValueError, OSError) as err:
        return encode_error(site.site, f"{type(err).__name__}: {err}")
    return encode_reply(site.site, len(x), scores, stats)


def site_sketch(site: SiteConfig, x, options, run: int = 0):
    """Sketch mode: this site's mean sketch of the request's public map (``kd_sketch``),
    released with the noise its own node config asks for (and recorded in its ledger)."""
    import numpy as np

    from distrank.metrics.options import score_options
    from distrank.metrics.privacy import release_sketch
    from distrank.metrics.sketch.family import feature_map

    o = score_options(options)
    if o.kernel != "rbf" or "bandwidth" not in (o.kernel_params or {}):
        raise ValueError("sketch mode: needs kernel rbf and a public 'bandwidth' (kernel-params)")
    made = feature_map(o, x.shape[1]).sketch(x)
    if not site.noise_epsilon:
        return made
    made = release_sketch(
        made, epsilon=site.noise_epsilon, delta=site.noise_delta, rng=np.random.default_rng()
    )
    if site.budget_epsilon:
        from distrank.flower.ledger import Ledger

        Ledger(site.ledger, site.budget_epsilon, site.noise_delta).record(
            run, made.noise_std * made.n / 2.0, 1
        )
    return made


@app.query(mods=[secure_site.guard_mod])
def query(msg: Message, context: Context) -> Message:
    """Answer the server's request with this site's scores (in secure mode: prepare them).
    What the site cannot answer leaves as a failure category (``secure.site.guard_mod``)."""
    site = SiteConfig.from_node_config(context.node_config)
    if "secure" in msg.content.config_records:
        return Message(secure_site.prepare(site, msg.content, context), reply_to=msg)
    return Message(score_site(site, msg.content, context.run_id), reply_to=msg)


@app.train(mods=[secure_site.guard_mod, secure_site.policy_mod, secaggplus_mod])
def train(msg: Message, context: Context) -> Message:
    """Secure mode's SecAgg+ round: ``secaggplus_mod`` runs its stages and masks the
    vector this site prepared; the site's policy checks each stage first, and a failure
    leaves as its category only (:mod:`distrank.flower.secure.site`)."""
    site = SiteConfig.from_node_config(context.node_config)
    return Message(secure_site.share(site.site, msg, context.state), reply_to=msg)
