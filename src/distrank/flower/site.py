"""The site: a Flower ``ClientApp`` that scores every model on the site's own features.

A site never sends features. It answers the server's one request with, per model,
its client scores D(X_i, Y) from :func:`distrank.metrics.score_client` (equal to
the ``client`` rows of ``distrank score`` for this site), its row count n_i and
its site id; and, only when its node config says ``share-stats=true`` and FD is
requested, its Gaussian statistics (n_i, mean_i, C_i) of ``metrics.fd.gaussian_stats``,
from which the server pools FD_all exactly. The mean and covariance reveal more
about the site's data than scores do: sharing them is the site's decision. In
secure mode (:mod:`distrank.flower.secure`) the site prepares its vector on the
request and sends it, masked, in a SecAgg+ round.

Node config of ``flower-supernode --node-config`` (TOML values):

    site-id      int or str, required: the client name in the table (reported, so
                 results do not depend on Flower's random node ids)
    features     str, required: npz file with ``features`` (n_i, d), the site's
                 reference features (read without pickle)
    share-stats  bool, default false: allow replying with the Gaussian statistics
    device       str, default "": torch device ("" is CUDA when available, else CPU)

Other keys are left to other apps the same SuperNode may run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp

from distrank.flower.messages import decode_request, encode_error, encode_reply

app = ClientApp()


@dataclass(frozen=True)
class SiteConfig:
    """A site's node config, checked."""

    site: int | str
    features: Path
    share_stats: bool = False
    device: str | None = None

    @classmethod
    def from_node_config(cls, config: Mapping) -> SiteConfig:
        site = config.get("site-id")
        if isinstance(site, bool) or not isinstance(site, (int, str)) or site == "":
            raise ValueError(
                f"node config: 'site-id' must be an int or a non-empty str, got {site!r}"
            )
        features = config.get("features")
        if not isinstance(features, str) or not features:
            raise ValueError(
                f"node config: 'features' must be the path of an npz file, got {features!r}"
            )
        share = config.get("share-stats", False)
        if not isinstance(share, bool):
            raise ValueError(f"node config: 'share-stats' must be true or false, got {share!r}")
        device = config.get("device", "")
        if not isinstance(device, str):
            raise ValueError(f"node config: 'device' must be a str, got {device!r}")
        return cls(site, Path(features), share, device or None)


def score_site(site: SiteConfig, request: RecordDict) -> RecordDict:
    """The reply content to ``request``: scores (and statistics, if allowed), or the
    error that prevented them (a bad request, an unreadable file, too few rows)."""
    from distrank.features.cache import load_features
    from distrank.metrics import score_client
    from distrank.metrics.fd import gaussian_stats

    try:
        models, options, want_stats = decode_request(request)
        x = load_features(site.features)
        scores = score_client(x, models, options, device=site.device)
        stats = gaussian_stats(x, device=site.device) if want_stats and site.share_stats else None
    except (ValueError, OSError) as err:
        return encode_error(site.site, f"{type(err).__name__}: {err}")
    return encode_reply(site.site, len(x), scores, stats)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Answer the server's request with this site's scores (in secure mode: prepare them)."""
    site = SiteConfig.from_node_config(context.node_config)
    if "secure" in msg.content.config_records:
        from distrank.flower.secure import prepare

        return Message(prepare(site, msg.content, context.state), reply_to=msg)
    return Message(score_site(site, msg.content), reply_to=msg)


@app.train(mods=[secaggplus_mod])
def train(msg: Message, context: Context) -> Message:
    """Secure mode's SecAgg+ round: ``secaggplus_mod`` runs its stages and masks the
    vector this site prepared (:mod:`distrank.flower.secure`)."""
    from distrank.flower.secure import share

    site = SiteConfig.from_node_config(context.node_config)
    return Message(share(site.site, msg.content, context.state), reply_to=msg)
