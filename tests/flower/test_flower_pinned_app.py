"""A site runs only the Flower apps it pinned (``distrank.flower.supernode``), on loopback.

A coordinator that ships its own FAB runs its own code at the sites. The foreign app
here (written to tmp_path, modules and all) has a ClientApp that reads the node config's
``features`` npz and replies with the rows and the node config, and a ServerApp that
asks every node once and writes what it got. On stock ``flower-supernode`` processes it
takes every site's exact rows; on ``python -m distrank.flower.supernode`` processes it
gets only Flower's FAB verification errors, no ClientApp starts, each site's log names
the refused hash, and distrank's own app (the default pin) still runs and scores.
One SuperLink and three SuperNodes per mode (``loopback.Loopback``), started together.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest
from flwr.cli.build import build_fab_from_disk
from flwr.common.constant import ErrorCode
from flwr.supercore.fab import Fab
from flwr.supernode.start_client_internal import FAB_VERIFICATION_ERROR as REFUSED
from loopback import PINNED, Loopback

from distrank.flower import APP_DIR, supernode
from distrank.metrics import score

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning"),  # FAB builds
]

PYPROJECT = """\
[project]
name = "foreign"
version = "1.0.0"
license = "MIT"
dependencies = ["flwr", "numpy"]

[tool.flwr.app]
publisher = "coordinator"

[tool.flwr.app.components]
serverapp = "foreign.server:app"
clientapp = "foreign.client:app"

[tool.flwr.app.config]
out = ""
nodes = 3
"""
CLIENT = """\
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    site = context.node_config["site-id"]
    Path(f"{context.run_config['out']}.clientapp-{site}").touch()  # this code ran at the site
    rows = np.load(context.node_config["features"])["features"]
    content = {"rows": ArrayRecord({"x": Array(rows)}), "node": ConfigRecord(context.node_config)}
    return Message(RecordDict(content), reply_to=msg)
"""
SERVER = """\
import json
import time

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    deadline = time.monotonic() + 60
    while len(nodes := list(grid.get_node_ids())) < context.run_config["nodes"]:
        assert time.monotonic() < deadline, nodes
        time.sleep(0.5)
    asks = [Message(RecordDict(), dst_node_id=n, message_type="query") for n in nodes]
    got = []
    for reply in grid.send_and_receive(asks, timeout=60):
        if reply.has_error():
            got.append({"error": reply.error.code, "reason": reply.error.reason})
        else:
            rows = reply.content["rows"]["x"].numpy().tolist()
            got.append({"node": dict(reply.content["node"]), "rows": rows})
    with open(context.run_config["out"], "w") as f:
        json.dump(got, f)
"""
#: the files the foreign ServerApp and distrank's write, in their network's folder
STOLEN, SCORES = "stolen.json", "scores.csv"


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    """The foreign app's folder and the sha256 of the FAB that ``flwr run`` ships of it."""
    app = tmp_path_factory.mktemp("foreign-app")
    (app / "pyproject.toml").write_text(PYPROJECT)
    (app / "foreign").mkdir()
    for name, text in {"__init__": "", "client": CLIENT, "server": SERVER}.items():
        (app / "foreign" / f"{name}.py").write_text(text)
    return app, hashlib.sha256(build_fab_from_disk(app)).hexdigest()


@pytest.fixture(scope="module")
def networks(tmp_path_factory, federation, foreign):
    """(stock network, pinned network, run -> run id): each network runs the foreign app,
    the pinned one distrank's app too, all started at once."""
    sites, models = federation
    nets = []
    try:
        for mode, command in {"stock": ("flower-supernode",), "pinned": PINNED}.items():
            root = tmp_path_factory.mktemp(mode)
            extra = {site: f'note="{site}, {mode}"' for site in sites}  # more node config
            nets.append(Loopback.of_arrays(root, sites, models, supernode=command, extra=extra))
        (stock, _), (pinned, config) = nets
        kd = {"metrics": "kd", "dtype": "float64", "timeout": 120.0}
        starts = {
            "stock": (stock, {"out": str(stock.root / STOLEN)}, foreign[0]),
            "pinned": (pinned, {"out": str(pinned.root / STOLEN)}, foreign[0]),
            "distrank": (pinned, config | kd | {"out": str(pinned.root / SCORES)}, APP_DIR),
        }
        with ThreadPoolExecutor(len(starts)) as pool:  # each flwr call is a Python start-up
            ids = dict(zip(starts, pool.map(lambda s: s[0].run(*s[1:]), starts.values())))
        yield stock, pinned, ids
    finally:
        for net, _ in nets:
            net.close()


def attack(net: Loopback, run_id: str) -> tuple[list, dict]:
    """What the foreign app's ServerApp got on ``net``, and its run."""
    run = net.wait_finished(run_id, timeout=120)
    assert run["status"] == "finished:completed", run
    return json.loads((net.root / STOLEN).read_text()), run


def test_a_stock_supernode_runs_a_foreign_app_that_takes_every_sites_rows(
    networks, foreign, federation
):
    net, _, runs = networks
    got, run = attack(net, runs["stock"])
    assert run["fab-hash"] == foreign[1]
    stolen = {reply["node"]["site-id"]: np.asarray(reply["rows"]) for reply in got}
    assert stolen.keys() == federation[0].keys()
    for site, rows in federation[0].items():
        np.testing.assert_array_equal(stolen[site], rows)  # every row, every bit
        (node,) = (reply["node"] for reply in got if reply["node"]["site-id"] == site)
        assert node["note"] == f"{site}, stock" and node["plain"] == "scores,sketch"  # all of it
        assert (net.root / f"{STOLEN}.clientapp-{site}").exists()


def test_a_pinned_supernode_refuses_the_foreign_app_and_logs_its_hash(networks, foreign):
    _, net, runs = networks
    got, run = attack(net, runs["pinned"])
    assert run["fab-hash"] == foreign[1]
    assert REFUSED.code == ErrorCode.INVALID_FAB
    refusal = {"error": REFUSED.code, "reason": REFUSED.reason}
    assert got == [refusal] * 3  # Flower's FAB_VERIFICATION_ERROR from every site, no rows
    assert not list(net.root.glob(f"{STOLEN}.clientapp-*"))  # no ClientApp started
    for site in ("oslo", "paris", "rome"):
        log = net.logs[site].read_text()
        assert f"distrank: refused FAB {foreign[1]} (sha256 not pinned" in log, log[-3000:]


def test_distrank_runs_on_pinned_supernodes(networks, reference, federation):
    """Its FAB's hash, as the SuperLink serves it, is the default pin; KD avg as scored."""
    _, net, runs = networks
    printed = subprocess.Popen(
        [sys.executable, "-m", "distrank.flower.supernode", "--print-pin"],
        stdout=subprocess.PIPE,
        text=True,
    )
    run = net.wait_finished(runs["distrank"], timeout=150)
    assert run["status"] == "finished:completed", run
    pin = supernode.default_pin()
    assert run["fab-hash"] == pin == printed.communicate(timeout=60)[0].strip()
    for site in ("oslo", "paris", "rome"):
        assert f"distrank: FAB {pin} is pinned" in net.logs[site].read_text()
    table = pd.read_csv(net.root / SCORES, keep_default_na=False)
    expected = score(*reference, federation[1], metrics=["kd"], dtype="float64")
    avg = table[table.aggregation == "avg"].merge(
        expected, on=["model", "metric", "aggregation", "client"], suffixes=("", "_score")
    )
    assert len(avg) == 2 and set(avg.metric) == {"kd"}
    np.testing.assert_allclose(avg.value, avg.value_score, rtol=1e-9, atol=1e-12)


def test_a_flower_without_the_replaced_names_is_named(monkeypatch):
    monkeypatch.delattr(supernode.loop, "_verify_fab")
    with pytest.raises(RuntimeError, match=r"lacks _verify_fab\(fab\)"):
        supernode.pin_fabs(["0" * 64])


def test_pin_fab_replaces_the_default_and_flower_gets_the_other_arguments(monkeypatch):
    """``--pin-fab`` (any case) is the pin set; with trusted entities a FAB must also be
    signed (Flower's check); every other argument reaches ``flower-supernode``."""
    import flwr.supernode.cli

    for name in supernode.TARGETS:  # put back after the test
        monkeypatch.setattr(supernode.loop, name, getattr(supernode.loop, name))
    monkeypatch.setattr(sys, "argv", ["distrank-supernode"])
    ours, distrank = Fab("", b"our app", {}), Fab("", build_fab_from_disk(APP_DIR), {})
    seen = {}

    def flower_supernode():
        verify = supernode.loop._verify_fab
        seen["argv"] = sys.argv[1:]
        seen["ours"], seen["distrank"] = (verify(f, supernode.PIN_ONLY) for f in (ours, distrank))
        seen["unsigned"] = verify(ours, {"someone": "ssh-ed25519 AAAA"})

    monkeypatch.setattr(flwr.supernode.cli, "flower_supernode", flower_supernode)
    pin = hashlib.sha256(b"our app").hexdigest().upper()
    supernode.main(["--insecure", "--pin-fab", pin, "--node-config", 'site-id="a"'])
    assert seen == {
        "argv": ["--insecure", "--node-config", 'site-id="a"'],
        "ours": True,
        "distrank": False,
        "unsigned": False,
    }
    with pytest.raises(SystemExit):
        supernode.main(["--pin-fab", "abc"])
