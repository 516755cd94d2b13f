"""The Flower protocol without a network: messages, the site's reply, the server's table
and its wait for sites, against ``distrank.metrics.score`` on the pooled reference."""

from __future__ import annotations

import time
import tomllib
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flwr.app import Message
from flwr.serverapp import Grid
from secure_run import RBF_KD
from textkit import visible_lines

from distrank.flower import APP_DIR
from distrank.flower.federation import RUN_CONFIG, FederationError, RunSettings, gather
from distrank.flower.messages import (
    decode_reply,
    decode_request,
    encode_error,
    encode_reply,
    encode_request,
)
from distrank.flower.node import SiteConfig
from distrank.flower.policy import Policy
from distrank.flower.secure import SECURE_CONFIG
from distrank.flower.server import federated_table
from distrank.flower.site import score_site
from distrank.metrics import score
from distrank.metrics.fd._frechet import gaussian_stats

OPTIONS = RBF_KD | {  # every metric, through KID's polynomial kernel
    "metrics": ["kd", "fd", "precision", "recall", "density", "coverage"],
    "kernel": "poly",
    "kernel_params": {},
}
KEY = ["model", "metric", "aggregation", "client"]


def plain(**policy) -> Policy:
    """A policy that opens plain scores (and sketches)."""
    return Policy(plain=("scores", "sketch"), **policy)


def site_replies(tmp_path, sites, models, *, share=True, ids=None, **options):
    """Each site's reply to one request, through the ClientApp's own code."""
    request = encode_request(models, OPTIONS | options)
    replies = []
    for i, (name, x) in enumerate(sites.items()):
        path = tmp_path / f"{name}.npz"
        np.savez(path, features=x)
        site = SiteConfig(name if ids is None else ids[i], path, plain(share_stats=share))
        replies.append(decode_reply(score_site(site, request)))
    return replies


def test_request_and_reply_round_trip_exactly(federation):
    sites, models = federation
    got_models, got_options, want_stats = decode_request(
        encode_request(models, OPTIONS | {"kernel_params": {"degree": 2, "coef0": 0.5}})
    )
    assert want_stats and list(got_models) == list(models)
    for name, y in models.items():
        assert got_models[name].dtype == y.dtype and np.array_equal(got_models[name], y)
    assert got_options == OPTIONS | {"kernel_params": {"degree": 2, "coef0": 0.5}}
    stats = gaussian_stats(sites["oslo"])
    scores = {"sharp": {"kd": 0.1 + 1e-17, "fd": 1 / 3}, "broad": {"kd": np.pi, "fd": 2.0}}
    reply = decode_reply(
        encode_reply(7, 60, scores, {"fd": {"mean": stats.mean, "cov": stats.cov}})
    )
    assert (reply.site, reply.n, reply.scores, reply.error) == (7, 60, scores, "")
    assert np.array_equal(reply.stats["fd"]["mean"], stats.mean) and np.array_equal(
        reply.stats["fd"]["cov"], stats.cov
    )
    assert decode_reply(encode_error("rome", "OSError: gone")).error == "OSError: gone"


def test_table_equals_score_on_the_pooled_reference(tmp_path, federation, reference):
    sites, models = federation
    table = federated_table(site_replies(tmp_path, sites, models), models=models)
    expected = score(*reference, models, dtype="float64")
    assert list(table.columns) == ["model", "metric", "aggregation", "client", "value"]
    merged = table.merge(expected, on=KEY, how="left", suffixes=("", "_score"))
    assert merged.value_score.notna().all()  # every row of ours is a row of score's
    np.testing.assert_allclose(merged.value, merged.value_score, rtol=1e-9, atol=1e-12)
    rows = set(map(tuple, table[KEY].values))
    for row in expected[KEY].itertuples(index=False):  # and all of score's but D_all
        assert (tuple(row) in rows) == (row.aggregation != "all" or row.metric == "fd")
    # avg is the n_i / n weighted mean of the client rows (lambda by hand)
    n = np.array([len(x) for x in sites.values()])
    wide = table.set_index(KEY).value
    for model in models:
        local = [wide[model, "kd", "client", s] for s in sites]
        assert wide[model, "kd", "avg", ""] == pytest.approx(n @ local / n.sum(), rel=1e-12)


def test_no_fd_all_unless_every_site_shares_statistics(tmp_path, federation):
    sites, models = federation
    replies = site_replies(tmp_path, sites, models, share=False)
    assert all(r.stats is None for r in replies)
    table = federated_table(replies, models=models)
    assert set(table.aggregation) == {"avg", "client"}
    mixed = replies[:2] + site_replies(tmp_path, {"rome": sites["rome"]}, models)
    assert set(federated_table(mixed, models=models).aggregation) == {"avg", "client"}


def test_int_site_ids_sort_as_score_sorts_clients(tmp_path, federation):
    sites, models = federation
    ids = [10, 2, 1]
    replies = site_replies(tmp_path, sites, models, ids=ids, metrics=["kd"])
    table = federated_table(replies[::-1], models=models, weights="uniform")
    labels = np.repeat(ids, [len(x) for x in sites.values()])
    expected = score(
        np.concatenate(list(sites.values())),
        labels,
        models,
        metrics=["kd"],
        weights="uniform",
        dtype="float64",
    )
    assert list(table.client[table.aggregation == "client"])[:3] == ["1", "2", "10"]
    merged = table.merge(expected, on=KEY, suffixes=("", "_score"))
    assert len(merged) == len(table)
    np.testing.assert_allclose(merged.value, merged.value_score, rtol=1e-9)


def test_kd_std_has_client_rows_only(tmp_path, federation):
    sites, models = federation
    replies = site_replies(
        tmp_path, sites, models, metrics=["kd"], kd_estimator="subsets", n_subsets=2, subset_size=30
    )
    table = federated_table(replies, models=models)
    assert set(table[table.metric == "kd_std"].aggregation) == {"client"}


def test_a_site_error_is_a_reply(tmp_path, federation):
    sites, models = federation
    request = encode_request(models, OPTIONS)
    missing = decode_reply(score_site(SiteConfig("oslo", tmp_path / "none.npz", plain()), request))
    assert missing.site == "oslo" and missing.error == (
        f"InputError: {tmp_path / 'none.npz'}: no such file"
    )
    bad = encode_request(models, OPTIONS | {"kernel": "rbf"})
    path = tmp_path / "x.npz"
    np.savez(path, features=sites["oslo"])
    assert (
        "kernel 'rbf' needs a 'bandwidth'"
        in decode_reply(score_site(SiteConfig("oslo", path, plain()), bad)).error
    )


def test_a_secure_only_site_answers_no_plain_request(tmp_path, federation):
    """Not its scores, nor its statistics though it allows them in secure sums; and a
    site that opens plain sketches gives no plain scores."""
    sites, models = federation
    path = tmp_path / "oslo.npz"
    np.savez(path, features=sites["oslo"])
    for opened in ((), ("sketch",)):
        site = SiteConfig("oslo", path, Policy(share_stats=True, plain=opened))
        content = score_site(site, encode_request(models, OPTIONS))
        reply = decode_reply(content)
        assert (reply.site, reply.n, reply.scores, reply.stats) == ("oslo", 0, {}, None)
        assert reply.error == "Refused: this site's policy gives no plain scores"
        assert not content.array_records


@pytest.mark.parametrize(
    "config,match",
    [
        ({}, "'site-id' must be"),
        ({"site-id": True, "features": "/x.npz"}, "'site-id' must be"),
        ({"site-id": "a"}, "'features' must be"),
        ({"site-id": "a", "features": "/x.npz", "share-stats": "yes"}, "'share-stats' must be"),
        (
            {"site-id": "a", "features": "/x.npz", "secure-only": False},
            "'secure-only' is replaced by 'plain'",
        ),
        ({"site-id": "a", "features": "/x.npz", "plain": "all"}, "'plain' must be a list of"),
        ({"site-id": "a", "features": "/x.npz", "rows": "hidden"}, "'rows' must be one of"),
        ({"site-id": "a", "features": "/x.npz", "budget-epsilon": 3.0}, "'noise-delta' must be in"),
        (
            {"site-id": "a", "features": "/x.npz", "budget-epsilon": 3, "noise-delta": 1e-5},
            "'budget-epsilon' needs 'noise-epsilon'",
        ),
        (
            {"site-id": "a", "features": "/x.npz", "policy": "/no/such.toml"},
            "not a readable TOML policy",
        ),
        ({"site-id": "a", "features": "/x.npz", "min-sites": 1}, "'min-sites' must be an int >= 2"),
        ({"site-id": "a", "features": "/x.npz", "min-sites": 3.0}, "'min-sites' must be an int"),
        ({"site-id": "a", "features": "/x.npz", "feature-bound": -1}, "'feature-bound' must be a"),
        ({"site-id": "a", "features": "/x.npz", "noise-epsilon": 1.0}, "'noise-delta' must be in"),
        (
            {"site-id": "a", "features": "/x.npz", "budget-epsilon": 3, "noise-epsilon": 1}
            | {"noise-delta": 1e-5},
            "'budget-epsilon' needs a 'ledger'",
        ),
        ({"site-id": "a", "features": "/x.npz", "peers": 3}, "'peers' must be a path"),
    ],
)
def test_node_config_errors(config, match):
    assert SiteConfig.from_node_config({"site-id": 7, "features": "/x.npz"}) == SiteConfig(
        7, Path("/x.npz"), Policy(share_stats=False, plain=(), secure=True, min_sites=3)
    )
    with pytest.raises(ValueError, match=match):
        SiteConfig.from_node_config(config)


def test_app_declares_the_run_config_of_the_server():
    app = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["config"] == RUN_CONFIG | SECURE_CONFIG
    assert app["components"] == {
        "serverapp": "distrank.flower.server:app",
        "clientapp": "distrank.flower.site:app",
    }


def test_run_config():
    base = RUN_CONFIG | {
        "models": "a=/m/a.npz, b=/m/b.npz",
        "sites": "x,y",
        "out": "/o.csv",
        "kernel-params": "bandwidth=2.5,degree=3",
    }
    run = RunSettings.from_run_config(base)
    assert {k: str(v) for k, v in run.models.items()} == {"a": "/m/a.npz", "b": "/m/b.npz"}
    assert run.sites == ["x", "y"] and run.report is None
    assert run.options["kernel_params"] == {"bandwidth": 2.5, "degree": 3}
    assert isinstance(run.options["kernel_params"]["degree"], int)
    for change, match in [
        ({"models": ""}, "'models' is empty"),
        ({"models": "a=rel.npz"}, "'models' needs an absolute path"),
        ({"models": "a=/x.npz,a=/y.npz"}, "distinct NAME=PATH"),
        ({"sites": "x,x"}, "distinct site ids"),
        ({"out": "o.csv"}, "'out' needs an absolute path"),
        ({"metrics": "kd,fid"}, "metrics: expected"),
        ({"weights": "equal"}, "run config: weights: expected one of"),
        ({"timeout": 0}, "'timeout' must be positive"),
        ({"pr-k": 2.5}, "'pr-k' must be int"),
        ({"kernel-params": "bandwidth=wide"}, "NAME=NUMBER"),
    ]:
        with pytest.raises(ValueError, match=match):
            RunSettings.from_run_config(base | change)


class LocalGrid(Grid):
    """A Grid whose nodes answer in-process (``answer(node, message) -> content``), each
    after ``delay`` seconds, joining at their ``join`` time; ``None`` never answers."""

    def __init__(self, answer, join=None, delay=0.0):
        self.answer, self.join, self.delay = answer, join or {}, delay
        self.start, self.sent = time.monotonic(), {}

    def get_node_ids(self):
        now = time.monotonic() - self.start
        return [node for node, t in self.join.items() if t <= now]

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())  # as the SuperLink does
            self.sent[msg.metadata.message_id] = (msg, time.monotonic())
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        out = []
        for mid in message_ids:
            msg, sent_at = self.sent[mid]
            content = self.answer(msg.metadata.dst_node_id, msg)
            if content is not None and time.monotonic() - sent_at >= self.delay:
                out.append(Message(content, reply_to=msg))
        return out

    def set_run(self, run):
        pass

    @property
    def run(self):
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        raise NotImplementedError


def test_gather_sends_the_request_to_nodes_that_join_late(tmp_path, federation, server_process):
    sites, models = federation
    paths = {}
    for name, x in sites.items():
        paths[name] = tmp_path / f"{name}.npz"
        np.savez(paths[name], features=x)
    names = dict(zip([11, 22, 33], sites))
    grid = LocalGrid(
        lambda node, msg: score_site(
            SiteConfig(names[node], paths[names[node]], plain()), msg.content
        ),
        join={11: 0.0, 22: 0.0, 33: 0.6},
    )
    replies = gather(
        grid,
        encode_request(models, OPTIONS | {"metrics": ["kd"]}),
        sites=["rome", "oslo", "paris"],
        timeout=30,
        poll=0.1,
    )
    assert [r.site for r in replies] == ["rome", "oslo", "paris"]
    assert len(grid.sent) == 3


def test_gather_names_the_site_that_never_replies_within_the_timeout(federation, server_process):
    _, models = federation

    def answer(node, msg):
        return None if node == 3 else encode_reply(f"site{node}", 10, {"m": {"kd": 0.0}})

    grid = LocalGrid(answer, join={1: 0.0, 2: 0.0, 3: 0.0})
    start = time.monotonic()
    with pytest.raises(FederationError, match=r"no reply within 0.8 s from site\(s\) \['site3'\]"):
        gather(
            grid,
            encode_request(models, OPTIONS),
            sites=["site1", "site2", "site3"],
            timeout=0.8,
            poll=0.1,
        )
    assert 0.8 <= time.monotonic() - start < 2.0


def test_gather_relays_site_errors_and_strangers(federation, server_process):
    _, models = federation
    contents = {
        1: encode_reply("a", 10, {"m": {"kd": 0.0}}),
        2: encode_error("b", "no disk"),
        3: encode_reply("zz", 10, {"m": {"kd": 0.0}}),
    }
    grid = LocalGrid(lambda node, msg: contents[node], join={1: 0, 2: 0, 3: 0})
    with pytest.raises(FederationError) as err:
        gather(grid, encode_request(models, OPTIONS), sites=["a", "b"], timeout=0.5, poll=0.1)
    assert "site 'b' failed: no disk" in str(err.value)
    assert "site 'zz' (node 3) is not one of the sites ['a', 'b']" in str(err.value)


def test_the_table_is_the_csv_of_distrank_score(tmp_path, federation, reference):
    """Same columns and the same CSV reading as the CLI's table (client "" for pooled rows)."""
    sites, models = federation
    table = federated_table(
        site_replies(tmp_path, sites, models, metrics=["kd", "fd"]), models=models
    )
    table.to_csv(tmp_path / "t.csv", index=False)
    back = pd.read_csv(tmp_path / "t.csv", keep_default_na=False)
    pd.testing.assert_frame_equal(back, table)


@pytest.mark.parametrize("share", [True, False])
def test_the_report_page_reads_the_federated_table(tmp_path, federation, share):
    from distrank.flower.server import report_meta
    from distrank.report.html import build_report

    sites, models = federation
    replies = site_replies(tmp_path, sites, models, share=share, metrics=["kd", "fd", "recall"])
    settings = RunSettings.from_run_config(
        RUN_CONFIG | {"models": "a=/a.npz", "sites": "x", "out": "/o.csv"}
    )
    meta = report_meta(replies, settings)
    assert meta["reference"] == {s: {"n": len(x)} for s, x in sites.items()}
    page = build_report(federated_table(replies, models=models), meta=meta)
    lines = visible_lines(page)
    assert lines.count("model " + " ".join(sorted(sites))) == 3  # KD, FD, Recall: per client
    client_only = [line for line in lines if line.startswith("This table has no pooled ('all') ")]
    assert len(client_only) == (not share)
    guarantees = "; ".join(f"{s}: {g}" for s, g in meta["privacy"]["sites"].items())
    assert lines[lines.index("privacy") + 1] == guarantees  # each site's attested guarantee
