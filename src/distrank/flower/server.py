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
            ``metrics.fd.pool_stats``, equal to FD_all on the pooled reference

(Wang et al., "Consistent Distributed Ranking of Generative Models via Kernel
Distances", arXiv 2310.11714.) A site that does not reply in time, replies with
an error, or is not one of ``sites`` fails the run: the server names it and writes
no table.

Run config (``[tool.flwr.app.config]`` of the app, overridden by ``flwr run
--run-config``); paths are on the SuperLink's machine and must be absolute:

    models        "NAME=/path/features.npz,..." (npz with ``features``), required
    sites         "site-a,site-b,...": the site ids expected to reply, required
    out           the CSV to write, required
    report        the consistency report page to write ("" for none)
    metrics       comma-separated subset of kd,fd,precision,recall,density,coverage
    kernel, kernel-params ("bandwidth=2.5,degree=3"; rbf/laplace need a bandwidth),
    kd-estimator, n-subsets, subset-size, seed, pr-k, dc-k, dtype: as in ``distrank score``
    weights       size or uniform
    timeout       seconds to wait for all sites to connect and reply
    secure, feature-bound, max-rows, secure-threshold: secure mode, the server learns
                  only the sum of the sites' vectors (:mod:`distrank.flower.secure`)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path

import numpy as np
import pandas as pd
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from distrank.flower.messages import OPTION_KEYS, SiteReply, decode_reply, encode_request
from distrank.metrics.options import ScoreOptions

app = ServerApp()


def _option_defaults() -> dict[str, object]:
    """The scoring options' run config keys and defaults: those of ``ScoreOptions``,
    spelled as TOML keys and values (lists and kernel parameters as text)."""
    out = {}
    for name, default in ScoreOptions.defaults().items():
        if name == "metrics":
            default = ",".join(default)
        elif name == "kernel_params":
            default = ""
        out[name.replace("_", "-")] = default
    return out


#: the run config keys and their defaults (the app's pyproject.toml declares the same)
RUN_CONFIG = {
    "models": "",
    "sites": "",
    "out": "",
    "report": "",
    **_option_defaults(),
    "timeout": 600.0,
}


class FederationError(RuntimeError):
    """Sites missing, failing or unknown: no table is written."""


@dataclass(frozen=True)
class RunSettings:
    """The run config, checked."""

    models: dict[str, Path]
    sites: list[str]
    out: Path
    report: Path | None
    score_options: ScoreOptions
    timeout: float

    @property
    def weights(self) -> str:
        return self.score_options.weights

    @property
    def options(self) -> dict:
        """The scoring options a request carries (``messages.OPTION_KEYS``)."""
        return {k: v for k, v in self.score_options.as_dict().items() if k in OPTION_KEYS}

    @classmethod
    def from_run_config(cls, config: Mapping) -> RunSettings:
        def get(key, kind):
            value = config.get(key, RUN_CONFIG[key])
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"run config: {key!r} must be {kind.__name__}, got {value!r}")
            return value

        models = {}
        for spec in _items(get("models", str)):
            name, sep, path = spec.partition("=")
            if not sep or not name.strip() or name.strip() in models:
                raise ValueError(
                    f"run config: 'models' needs distinct NAME=PATH items, got {spec!r}"
                )
            models[name.strip()] = _absolute(path.strip(), "models")
        if not models:
            raise ValueError("run config: 'models' is empty (expected NAME=PATH,...)")
        sites = _items(get("sites", str))
        if not sites or len(set(sites)) != len(sites):
            raise ValueError(f"run config: 'sites' needs distinct site ids, got {sites!r}")
        timeout = float(get("timeout", (int, float)))
        if not timeout > 0:
            raise ValueError(f"run config: 'timeout' must be positive, got {timeout!r}")
        values = {  # of the type of the default: str or int
            name: get(name.replace("_", "-"), type(default))
            for name, default in ScoreOptions.defaults().items()
            if name not in ("metrics", "kernel_params")
        }
        values["metrics"] = _items(get("metrics", str))
        values["kernel_params"] = _kernel_params(get("kernel-params", str))
        try:
            options = ScoreOptions(**values)
        except ValueError as err:
            raise ValueError(f"run config: {err}") from None
        report = get("report", str)
        return cls(
            models,
            sites,
            _absolute(get("out", str), "out"),
            _absolute(report, "report") if report else None,
            options,
            timeout,
        )


def gather(
    grid: Grid,
    request: RecordDict,
    *,
    sites: Sequence[str],
    timeout: float,
    poll: float = 1.0,
    decode: Callable[[Message], SiteReply] | None = None,
) -> list[SiteReply]:
    """Send ``request`` to every node and return the replies of ``sites``, in that order.

    Nodes that connect while the server waits get the request too; the wait ends
    when every site in ``sites`` has answered or after ``timeout`` seconds. Raises
    :class:`FederationError` naming each site that did not reply in time, replied
    with an error or twice, and each reply from a site not in ``sites``. ``decode``
    reads a reply message (default: :func:`decode_reply` of its content); what it
    returns needs a ``site`` and an ``error``.
    """
    deadline = time.monotonic() + timeout
    pending: dict[str, int] = {}  # message id -> node id
    contacted: set[int] = set()
    problems: list[str] = []
    heard: dict[str, SiteReply] = {}
    while True:
        new = [node for node in grid.get_node_ids() if node not in contacted]
        if new:
            messages = [
                Message(request, dst_node_id=node, message_type=MessageType.QUERY, ttl=timeout)
                for node in new
            ]
            ids = list(grid.push_messages(messages))
            if len(ids) != len(new) or not all(ids):
                raise FederationError(
                    f"the SuperLink did not accept the request for nodes "
                    f"{new} (see its log; too large a message?)"
                )
            pending.update(zip(ids, new))
            contacted.update(new)
            log(INFO, "distrank: request sent to %d node(s), %d in all", len(new), len(contacted))
        if pending:
            for reply in grid.pull_messages(list(pending)):
                node = pending.pop(reply.metadata.reply_to_message_id, None)
                _read_reply(reply, node, sites, heard, problems, decode)
        if all(site in heard for site in sites) or time.monotonic() >= deadline:
            break
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.0)))
    missing = [site for site in sites if site not in heard]
    if missing:
        problems.insert(
            0,
            f"no reply within {timeout:g} s from site(s) {missing} "
            f"({len(contacted)} node(s) contacted)",
        )
    if problems:
        raise FederationError("; ".join(problems))
    return [heard[site] for site in sites]


def _read_reply(
    reply: Message,
    node,
    sites: Sequence[str],
    heard: dict[str, SiteReply],
    problems: list[str],
    decode: Callable[[Message], SiteReply] | None = None,
) -> None:
    """File one reply under ``heard`` (by site id) or a problem under ``problems``."""
    if reply.has_error():
        problems.append(f"node {node} failed: {reply.error.reason}")
        return
    try:
        decoded = decode(reply) if decode else decode_reply(reply.content)
    except (ValueError, KeyError) as err:
        problems.append(f"node {node} sent a malformed reply: {err}")
        return
    name = str(decoded.site)
    if name not in sites:
        problems.append(f"site {name!r} (node {node}) is not one of the sites {list(sites)}")
    elif name in heard:
        problems.append(f"site {name!r} replied twice (two nodes with one site-id)")
    else:
        heard[name] = decoded
        if decoded.error:
            problems.append(f"site {name!r} failed: {decoded.error}")


def federated_table(
    replies: Sequence[SiteReply],
    *,
    models: Mapping | None = None,
    weights: str = "size",
    device=None,
) -> pd.DataFrame:
    """The tidy table from the sites' replies, sorted by site id as ``score`` sorts clients.

    ``avg`` rows use the package's client weights (``ClientGroups.weights``); FD
    ``all`` rows come only when every reply holds statistics and ``models`` (the
    generated features, name -> (m, d)) is given. ``kd_std`` has no ``avg``.
    """
    from distrank.clients import client_groups
    from distrank.metrics.table import from_rows

    if not replies:
        raise ValueError("replies: expected at least one site reply")
    ids = [r.site for r in replies]
    if len({type(s) for s in ids}) > 1 or len({str(s) for s in ids}) != len(ids):
        raise ValueError(f"replies: site ids must be distinct and of one type, got {ids!r}")
    sizes = np.array([r.n for r in replies], dtype=np.int64)
    groups = client_groups(np.repeat(np.asarray(ids), sizes), int(sizes.sum()))
    by_name = {str(r.site): r for r in replies}
    ordered = [by_name[name] for name in groups.names]
    lam = groups.weights(weights)
    first = _same_scores(ordered)
    metrics = list(next(iter(first.values())))
    pooled_fd = _pooled_fd(ordered, models, device) if "fd" in metrics else {}
    rows = []
    for model in first:
        for metric in metrics:
            local = np.array([r.scores[model][metric] for r in ordered])
            if metric == "fd" and model in pooled_fd:
                rows.append((model, metric, "all", "", pooled_fd[model]))
            if metric != "kd_std":  # a std of the average is not the average of stds
                rows.append((model, metric, "avg", "", float(lam @ local)))
            rows += [(model, metric, "client", c, float(v)) for c, v in zip(groups.names, local)]
    return from_rows(rows)


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


def _pooled_fd(ordered: Sequence[SiteReply], models: Mapping | None, device) -> dict:
    """FD_all of every model from the pooled statistics, when every site shared them."""
    from distrank.metrics.fd import frechet_distances, gaussian_stats, pool_stats

    if models is None or any(r.stats is None for r in ordered):
        if without := [r.site for r in ordered if r.stats is None]:
            log(WARNING, "distrank: no FD_all: site(s) %s did not share statistics", without)
        return {}
    names = list(ordered[0].scores)
    model_stats = [gaussian_stats(models[name], device=device) for name in names]
    fd = frechet_distances([pool_stats([r.stats for r in ordered])], model_stats, device=device)
    return dict(zip(names, fd[0].tolist()))


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Score every model at every site and write the table (and the report page)."""
    from distrank.features.cache import load_features
    from distrank.metrics import table as score_table

    if context.run_config.get("secure", False):  # the sum of the sites' vectors only
        from distrank.flower import secure

        secure.main(grid, context)
        return

    settings = RunSettings.from_run_config(context.run_config)
    models = {name: load_features(path) for name, path in settings.models.items()}
    replies = gather(
        grid,
        encode_request(models, settings.options),
        sites=settings.sites,
        timeout=settings.timeout,
    )
    table = federated_table(replies, models=models, weights=settings.weights)
    score_table.write(table, settings.out, report_meta(replies, settings), "csv")
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
            meta=report_meta(replies, settings),
            title="Consistency report: federated evaluation",
            source=settings.out,
        )
        log(INFO, "distrank: wrote the report page %s", settings.report)


def report_meta(replies: Sequence[SiteReply], settings: RunSettings) -> dict:
    """What the report page needs beside the table: the options and each site's n_i."""
    return {
        "options": settings.score_options.as_dict(),
        "reference": {str(r.site): {"n": r.n} for r in replies},
    }


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _absolute(path: str, key: str) -> Path:
    if not path or not Path(path).is_absolute():
        raise ValueError(f"run config: {key!r} needs an absolute path on the server, got {path!r}")
    return Path(path)


def _kernel_params(text: str) -> dict[str, float | int]:
    params = {}
    for item in _items(text):
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = None
        if not sep or number is None:
            raise ValueError(f"run config: 'kernel-params' needs NAME=NUMBER items, got {item!r}")
        integral = name.strip() == "degree" and number.is_integer()
        params[name.strip()] = int(number) if integral else number
    return params
