"""The real thing on loopback: one flower-superlink and three flower-supernode processes.

Each site holds one client's features; ``flwr run`` starts the ServerApp, whose table
must equal ``distrank score`` on the pooled reference (avg and client rows to 1e-9,
FD_all to 1e-6). Then a site is killed while it scores: the run fails within its
timeout, names the site, and writes no table (``loopback.Loopback`` runs the processes).
"""

from __future__ import annotations

import signal
import time

import numpy as np
import pandas as pd
import pytest
from loopback import Loopback
from secure_run import pin_keys
from textkit import visible_lines

from distrank.metrics import score

pytestmark = pytest.mark.slow
KEY = ["model", "metric", "aggregation", "client"]


@pytest.fixture(scope="module")
def loopback(tmp_path_factory, federation):
    sites, models = federation
    root = tmp_path_factory.mktemp("flower")
    peers = pin_keys(root, sites)  # long-term keys and bounds for the secure run
    extra = {
        s: f'signing-key="{root / s}.key" peers="{peers}" feature-bound=12.0 max-rows=1000'
        for s in sites
    }
    net, config = Loopback.of_arrays(root, sites, models, extra=extra)
    config["dtype"] = "float64"
    try:
        yield net, config
    finally:
        net.close()


def test_the_federated_table_equals_distrank_score(loopback, reference, federation):
    net, config = loopback
    out, page = net.root / "scores.csv", net.root / "report.html"
    run = net.wait_finished(
        net.run(config | {"out": str(out), "report": str(page), "timeout": 120.0}), timeout=150
    )
    assert run["status"] == "finished:completed", run
    header = "model " + " ".join(sorted(federation[0]))  # of each metric's per-client table
    assert visible_lines(page.read_text()).count(header) == 6
    table = pd.read_csv(out, keep_default_na=False)
    expected = score(*reference, federation[1], dtype="float64")
    merged = table.merge(expected, on=KEY, how="outer", suffixes=("", "_score"), indicator=True)
    ours = merged[merged._merge != "right_only"]
    assert (ours._merge == "both").all(), ours[ours._merge != "both"]
    shared = merged[merged._merge == "both"]
    local = shared[shared.aggregation != "all"]
    assert len(local) == 2 * 6 * (1 + 3)  # models x metrics x (avg + 3 clients)
    np.testing.assert_allclose(local.value, local.value_score, rtol=1e-9, atol=1e-12)
    fd_all = shared[shared.aggregation == "all"]
    assert set(fd_all.metric) == {"fd"} and len(fd_all) == 2
    np.testing.assert_allclose(fd_all.value, fd_all.value_score, rtol=1e-6)
    assert set(merged[merged._merge == "right_only"].aggregation) == {"all"}  # no KD_all etc.


def test_secure_mode_equals_distrank_score_within_its_bounds(loopback, reference, federation):
    """The same sites through SecAgg+: KD and Recall avg and FD all, each within the bound
    written beside the table, and every metric ranks the models as ``distrank score``."""
    net, config = loopback
    out = net.root / "secure.csv"
    secure = {"secure": True, "feature-bound": 12.0, "max-rows": 1000, "metrics": "kd,fd,recall"}
    run = net.wait_finished(  # five ClientApp starts per site: 95 s on a loaded 2-core box
        net.run(config | secure | {"out": str(out), "timeout": 120.0}), timeout=300
    )
    assert run["status"] == "finished:completed", run
    table = pd.read_csv(out, keep_default_na=False)
    bounds = pd.read_csv(out.with_name("secure.bounds.csv"))
    expected = score(*reference, federation[1], metrics=["kd", "fd", "recall"], dtype="float64")
    merged = table.merge(expected, on=KEY, suffixes=("", "_score")).merge(
        bounds, on=["model", "metric", "aggregation"]
    )
    assert len(merged) == len(table) == 6 and (table.client == "").all()
    assert set(zip(merged.metric, merged.aggregation)) == {
        ("kd", "avg"),
        ("recall", "avg"),
        ("fd", "all"),
    }
    assert ((merged.value - merged.value_score).abs() <= merged.bound).all(), merged
    for _, rows in merged.groupby("metric"):
        assert rows.sort_values("value").model.tolist() == (
            rows.sort_values("value_score").model.tolist()
        )


def test_a_site_dying_mid_run_is_named_and_no_table_is_written(loopback):
    net, config = loopback
    out, timeout = net.root / "never.csv", 30.0
    log = net.logs["rome"]
    received = log.read_text().count("Receiving: query message")
    run_id = net.run(config | {"out": str(out), "timeout": timeout})
    deadline = time.monotonic() + 120
    while log.read_text().count("Receiving: query message") == received:  # rome got the request
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    net.kill("rome", signal.SIGKILL)  # the site's SuperNode, SuperExec and ClientApp at once
    run = net.wait_finished(run_id, timeout=timeout + 60)
    assert run["status"] == "finished:failed", run
    assert f"no reply within {timeout:g} s from site(s) ['rome']" in run["status-details"], run
    assert run["elapsed"] < timeout + 30, run  # the server waited no longer than its timeout
    assert not out.exists()
