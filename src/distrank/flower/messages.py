"""What travels between the server and a site, as Flower records.

One request per site (a ``query`` message) and one reply; each message starts a
client-app process, so every model goes in the same request:

    request  "models"   ArrayRecord   model name -> (m, d) generated features
             "options"  ConfigRecord  the scorer options of ``metrics.score_client``
                                      (``kernel_params`` as JSON text) and
                                      ``want_stats`` (a requested metric has a
                                      ``Metric.pooled``: FD)
    reply    "site"     ConfigRecord  site-id, n (reference rows, noised when the site's
                                      policy says so), models, metrics, error ("" on
                                      success)
             "attested" ConfigRecord  content: JSON of the noise the site added (block
                                      -> std) and the policy it applied; signed:
                                      [statement, signature] when the site has a key
             "scores"   ArrayRecord   values: (models, metrics) float64
             "stats"    ArrayRecord   "<metric>.<name>": each such metric's statistics
                                      (FD: fd.mean (d,), fd.cov (d, d)), only when the
                                      site's node config allows sharing them
    sketch mode (``metrics = "kd_sketch"``): no model goes down; the reply holds
             "sketch"   ArrayRecord   mean (D,): the site's mean sketch (with its own
                                      noise when its node config asks), metadata in
                                      the "site" record's sketch-meta (JSON)

Arrays travel as their bytes (``flwr.app.Array``), so every float arrives exactly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from distrank.metrics._options import specs
from distrank.metrics._registry import METRICS

if TYPE_CHECKING:  # torch: not for the ClientApp processes that only pass messages
    from distrank.metrics.sketch._maps import Sketch


def option_keys() -> tuple[str, ...]:
    """The keyword arguments of ``metrics.score_client`` that a request carries: every
    registered scoring option a site needs (``Option.site``; not ``weights``), a metric
    registered later (a plugin) included."""
    return tuple(name for name, option in specs().items() if option.site)


@dataclass(frozen=True, eq=False)
class SiteReply:
    """A site's answer: its id, row count, scores ``{model: {metric: value}}`` and,
    if it shares them, its statistics ``{metric: {name: array}}`` (``Metric.pooled``);
    or an error text."""

    site: int | str
    n: int
    scores: dict[str, dict[str, float]]
    stats: dict[str, dict[str, np.ndarray]] | None = None
    error: str = ""
    sketch: Sketch | None = None  # sketch mode: the site's mean sketch, instead of scores
    attested: dict | None = None  # what the site attests: its noise, its policy (flower.policy)


def encode_request(models: Mapping[str, np.ndarray], options: Mapping) -> RecordDict:
    """The request content: every model's features and the scorer options."""
    if set(options) != set(keys := option_keys()):
        raise ValueError(f"options: expected the keys {sorted(keys)}, got {sorted(options)}")
    config = {k: v for k, v in options.items() if k != "kernel_params"}
    config["kernel_params"] = json.dumps(dict(options["kernel_params"]))
    config["want_stats"] = any(METRICS[m].pooled is not None for m in options["metrics"])
    arrays = {str(name): Array(np.ascontiguousarray(y)) for name, y in models.items()}
    return RecordDict({"models": ArrayRecord(arrays), "options": ConfigRecord(config)})


def decode_request(content: RecordDict) -> tuple[dict[str, np.ndarray], dict, bool]:
    """(models, scorer options, want_stats) of a request."""
    try:
        arrays, config = content.array_records["models"], dict(content.config_records["options"])
    except KeyError as err:
        raise ValueError(f"request: no {err.args[0]!r} record") from None
    want_stats = bool(config.pop("want_stats", False))
    config["kernel_params"] = json.loads(config.get("kernel_params", "{}")) or None
    if set(config) != set(keys := option_keys()):
        raise ValueError(f"request: options {sorted(config)} do not match {sorted(keys)}")
    return {name: arr.numpy() for name, arr in arrays.items()}, config, want_stats


def encode_reply(
    site: int | str,
    n: int,
    scores: Mapping[str, Mapping[str, float]],
    stats: Mapping[str, Mapping[str, np.ndarray]] | None = None,
) -> RecordDict:
    """A site's reply: its scores of every model (and its statistics, if shared:
    metric -> name -> array)."""
    models = list(scores)
    metrics = list(next(iter(scores.values()))) if models else []
    if any(list(by_metric) != metrics for by_metric in scores.values()):
        raise ValueError("scores: every model needs the same metrics")
    values = np.array([[scores[m][k] for k in metrics] for m in models], dtype=np.float64)
    content = RecordDict(
        {
            "site": ConfigRecord(
                {"site-id": site, "n": int(n), "models": models, "metrics": metrics, "error": ""}
            ),
            "scores": ArrayRecord({"values": Array(values.reshape(len(models), len(metrics)))}),
        }
    )
    if stats is not None:
        content["stats"] = ArrayRecord(
            {
                f"{metric}.{name}": Array(np.asarray(array, np.float64))
                for metric, arrays in stats.items()
                for name, array in arrays.items()
            }
        )
    return content


def encode_sketch_reply(site: int | str, sketch: Sketch) -> RecordDict:
    """A site's reply in sketch mode: its mean sketch, n and the sketch's metadata."""
    record = {"site-id": site, "n": int(sketch.n), "error": ""}
    record["sketch-meta"] = json.dumps(dict(sketch.meta), sort_keys=True)
    mean = ArrayRecord({"mean": Array(np.asarray(sketch.mean, np.float64))})
    return RecordDict({"site": ConfigRecord(record), "sketch": mean})


def encode_error(site: int | str, error: str) -> RecordDict:
    """A site's reply when it could not score: its id and what went wrong."""
    return RecordDict(
        {
            "site": ConfigRecord(
                {"site-id": site, "n": 0, "models": [], "metrics": [], "error": error}
            )
        }
    )


def decode_reply(content: RecordDict) -> SiteReply:
    """The :class:`SiteReply` of a reply's content (ValueError if it is malformed)."""
    if "site" not in content.config_records:
        raise ValueError("reply: no 'site' record")
    site = content.config_records["site"]
    site_id, n, error = site.get("site-id"), site.get("n"), site.get("error", "")
    if isinstance(site_id, bool) or not isinstance(site_id, (int, str)):
        raise ValueError(f"reply: site-id must be an int or a str, got {site_id!r}")
    if error:
        return SiteReply(site_id, 0, {}, error=str(error))
    attested = None
    if "attested" in content.config_records:
        attested = json.loads(str(content.config_records["attested"].get("content", "{}")))
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"reply of site {site_id!r}: n must be a positive int, got {n!r}")
    if "sketch" in content.array_records:
        from distrank.metrics.sketch._maps import Sketch

        meta = json.loads(str(site.get("sketch-meta", "{}")))
        mean = content["sketch"]["mean"].numpy()
        return SiteReply(site_id, n, {}, sketch=Sketch(mean, n, meta), attested=attested)
    models, metrics = list(site.get("models", [])), list(site.get("metrics", []))
    values = content.array_records["scores"]["values"].numpy()
    if values.shape != (len(models), len(metrics)):
        raise ValueError(
            f"reply of site {site_id!r}: scores of shape {values.shape}, "
            f"expected ({len(models)}, {len(metrics)})"
        )
    scores = {m: {k: float(v) for k, v in zip(metrics, row)} for m, row in zip(models, values)}
    stats = None
    if "stats" in content.array_records:
        stats = _decode_stats(content.array_records["stats"], metrics, n, site_id)
    return SiteReply(site_id, n, scores, stats, attested=attested)


def _decode_stats(record: ArrayRecord, metrics, n: int, site_id) -> dict:
    """metric -> name -> array of a reply's "stats", each checked by its ``Metric.pooled``."""
    stats: dict = {}
    for key, array in record.items():
        metric, _, name = key.partition(".")
        stats.setdefault(metric, {})[name] = array.numpy()
    for metric, arrays in stats.items():
        pooled = METRICS[metric].pooled if metric in METRICS else None
        if pooled is None or metric not in metrics:
            raise ValueError(f"reply of site {site_id!r}: statistics of metric {metric!r}")
        try:
            pooled.check(arrays, n)
        except ValueError as err:
            raise ValueError(f"reply of site {site_id!r}: {metric} {err}") from None
    return stats
