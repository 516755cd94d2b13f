"""The server: a Flower ``ServerApp`` that asks every site for its scores and averages them.

It sends each site one request holding the generated features of every model,
waits at most ``timeout`` seconds for the sites named in ``sites``, and from their
replies (sorted by the site id each reports) writes the tidy table of
``distrank score`` (model, metric, aggregation, client, value):

    client  D(X_i, Y), as site i computed it
    avg     D_avg = sum_i lambda_i D(X_i, Y),  lambda_i = n_i / n (``weights="size"``)
            or 1 / k (``"uniform"``), the package's client weights
    all     FD only, and only when every site shared its Gaussian statistics:
            FD(pool(N(mean_i, C_i)), N(mean_Y, C_Y)) with the exact pooled moments of
            ``metrics.fd._frechet.pool_stats``, equal to FD_all on the pooled reference

(Wang et al., "Consistent Distributed Ranking of Generative Models via Kernel
Distances", arXiv 2310.11714.) A site that does not reply in time, replies with
an error, or is not one of ``sites`` fails the run: the server names it and writes
no table.

The run config and the gathering of replies are :mod:`distrank.flower.federation`'s;
``secure = true`` hands the run to :mod:`distrank.flower.secure`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import INFO, WARNING

import numpy as np
import pandas as pd
from flwr.app import Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from distrank.flower.federation import RunSettings, gather
from distrank.flower.messages import SiteReply, encode_request
from distrank.metrics._registry import models_free

app = ServerApp()


def federated_table(
    replies: Sequence[SiteReply],
    *,
    models: Mapping | None = None,
    weights: str = "size",
    device=None,
) -> pd.DataFrame:
    """The tidy table from the sites' replies, sorted by site id as ``score`` sorts clients.

    ``avg`` rows use the package's client weights (``ClientGroups.weights``); the
    ``all`` rows of a metric with ``Metric.pooled`` (FD) come only when every reply holds
    its statistics and ``models`` (the generated features, name -> (m, d)) is given. A
    spread (``kd_std``) has no ``avg``.
    """
    from distrank.clients import client_groups
    from distrank.metrics._table import from_values

    if not replies:
        raise ValueError("replies: expected at least one site reply")
    ids = [r.site for r in replies]
    if len({type(s) for s in ids}) > 1 or len({str(s) for s in ids}) != len(ids):
        raise ValueError(f"replies: site ids must be distinct and of one type, got {ids!r}")
    sizes = np.array([r.n for r in replies], dtype=np.int64)
    groups = client_groups(np.repeat(np.asarray(ids), sizes), int(sizes.sum()))
    by_name = {str(r.site): r for r in replies}
    ordered = [by_name[name] for name in groups.names]
    first = _same_scores(ordered)
    metrics = list(next(iter(first.values())))
    pooled = _pooled(ordered, metrics, models, device)
    values = {
        model: {
            metric: (
                pooled.get(metric, {}).get(model),
                [r.scores[model][metric] for r in ordered],
            )
            for metric in metrics
        }
        for model in first
    }
    return from_values(values, groups.names, groups.weights(weights))


def _same_scores(ordered: Sequence[SiteReply]) -> dict:
    """The first site's scores, once every site is seen to score the same models and metrics."""
    first = ordered[0].scores
    for r in ordered[1:]:
        if {m: list(v) for m, v in r.scores.items()} != {m: list(v) for m, v in first.items()}:
            raise ValueError(
                f"replies: site {r.site!r} scored other models or metrics than "
                f"site {ordered[0].site!r}"
            )
    return first


def _pooled(ordered: Sequence[SiteReply], metrics, models: Mapping | None, device) -> dict:
    """Metric -> model -> ``all``, of each metric whose ``all`` comes from the sites'
    statistics (``Metric.pooled``), when every site shared them."""
    from distrank.metrics._registry import METRICS

    out, names = {}, list(ordered[0].scores)
    for metric in metrics:
        pooled = METRICS[metric].pooled if metric in METRICS else None  # kd_std: a spread
        if pooled is None or models is None:
            continue
        if without := [r.site for r in ordered if metric not in (r.stats or {})]:
            log(
                WARNING, "distrank: no %s_all: site(s) %s did not share statistics", metric, without
            )
            continue
        sites = [(r.n, r.stats[metric]) for r in ordered]
        out[metric] = pooled.finish(sites, {g: models[g] for g in names}, device=device)
    return out


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Score every model at every site and write the table (and the report page)."""
    from distrank.features.cache import load_features
    from distrank.metrics._table import write

    if context.run_config.get("secure", False):  # the sum of the sites' vectors only
        from distrank.flower.secure import server

        server.main(grid, context)
        return

    settings = RunSettings.from_run_config(context.run_config)
    models = {name: load_features(path) for name, path in settings.models.items()}
    sketching = models_free(settings.options["metrics"])  # no model goes down
    replies = gather(
        grid,
        encode_request({} if sketching else models, settings.options),
        sites=settings.sites,
        timeout=settings.timeout,
    )
    meta = report_meta(replies, settings)
    if sketching:
        table, ranked = sketch_table(replies, models, sketches_dir(settings.out))
        meta = ranked | meta  # the run's options and the sites' attestations first
    else:
        table = federated_table(replies, models=models, weights=settings.weights)
    write(table, settings.out, meta, "csv")
    if sketching:
        from distrank.metrics.sketch._confidence import write_confidence

        write_confidence(meta, settings.out)
    log(
        INFO,
        "distrank: wrote %d rows from sites %s to %s",
        len(table),
        sorted({c for c in table.client if c}),
        settings.out,
    )
    if settings.report is not None:
        from distrank.report.html import write_report

        write_report(
            table,
            settings.report,
            meta=meta,
            title="Consistency report: federated evaluation",
            source=settings.out,
        )
        log(INFO, "distrank: wrote the report page %s", settings.report)


def sketches_dir(out):
    """Where sketch mode keeps the sites' sketches: ``scores.csv`` -> ``scores.sketches/``."""
    return out.with_name(f"{out.stem}.sketches")


def sketch_table(replies: Sequence[SiteReply], models: Mapping, folder):
    """Sketch mode: each site's sketch saved to ``folder/<site>.sketch.npz`` (``distrank
    rank --sketch`` scores later models from them, without the sites), the table of
    ``models`` from them (unbiased) and its metadata: the map, the sites' privacy and the
    confidence its noise leaves (``metrics.sketch._confidence.rank_sketches``)."""
    from distrank.metrics.sketch._confidence import rank_sketches
    from distrank.metrics.sketch._maps import save

    sites = {str(r.site): r.sketch for r in sorted(replies, key=lambda r: str(r.site))}
    folder.mkdir(parents=True, exist_ok=True)
    for name, made in sites.items():
        save(folder / f"{name}.sketch.npz", made)
    return rank_sketches(sites, models)


def report_meta(replies: Sequence[SiteReply], settings: RunSettings) -> dict:
    """What the report page needs beside the table: the options, each site's n_i (as it
    released it) and what each site attested: the noise it added ("no noise" where it
    added none) and the policy it applied."""
    from distrank.flower.secure.server import guarantee

    attested = {str(r.site): dict(r.attested or {}) for r in replies}
    return {
        "options": settings.score_options.as_dict(),
        "reference": {str(r.site): {"n": r.n} for r in replies},
        "attested": attested,
        "privacy": {"sites": {s: guarantee(a) for s, a in attested.items()}},
    }
