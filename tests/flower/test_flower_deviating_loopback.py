"""A deviating server over real processes: ``train.default`` after round one.

Flower routes ``train.<action>`` to a ClientApp's train function past the mods that
act on the exact type ``train`` (``secaggplus_mod``, the site's policy). The attacker
here is a ServerApp of its own whose FAB names distrank's ClientApp, on SuperNodes that
pinned that FAB (``distrank.flower.supernode --pin-fab``): it sends a valid secure
round-one query, then ``train.default``, and writes what came back. Before (the same
FAB's twin whose ClientApp is distrank's site routed as it was: no exact-type check,
the old ``share``), every site's stored vector comes back unmasked; now every site
refuses. One SuperLink and three SuperNodes (``loopback.Loopback``).
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from flwr.cli.build import build_fab_from_disk
from loopback import PINNED, Loopback
from secure_run import pin_keys

from distrank.flower.messages import option_keys
from distrank.flower.secure import plan as secure
from distrank.flower.secure import site as secure_site
from distrank.metrics._options import ScoreOptions

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning"),  # FAB builds
]

PYPROJECT = """\
[project]
name = "attack-{name}"
version = "1.0.0"
license = "MIT"
dependencies = ["distrank[flower]"]

[tool.flwr.app]
publisher = "coordinator"

[tool.flwr.app.components]
serverapp = "attack.server:app"
clientapp = "{clientapp}"

[tool.flwr.app.config]
out = ""
"""
SERVER = """\
import json
import time

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.common import FitIns, Parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat as compat
from flwr.serverapp import Grid, ServerApp

from distrank.flower.messages import option_keys
from distrank.flower.secure import plan as secure

app = ServerApp()
OPTIONS = {OPTIONS!r}


@app.main()
def main(grid: Grid, context: Context) -> None:
    deadline = time.monotonic() + 60
    while len(nodes := sorted(grid.get_node_ids())) < 3:
        assert time.monotonic() < deadline, nodes
        time.sleep(0.5)
    models = {"m": np.random.default_rng(0).normal(size=(40, 6))}
    plan = secure.Plan(("m",), ("kd",), 6, "size", 12.0, 1000, secure.kernel_bound("poly", {}, 6, 12.0), threshold=2)
    query = secure.encode_secure_request(models, OPTIONS, plan, secure.public_centre(models))
    got = {"round 1": [], "train.default": []}
    asks = [Message(query.copy(), dst_node_id=n, message_type="query") for n in nodes]
    for reply in grid.send_and_receive(asks, timeout=60):
        got["round 1"].append(reply.content.config_records["site"]["error"])
    asks = []
    for n in nodes:
        content = compat.fitins_to_recorddict(FitIns(Parameters([], ""), {}), True)
        content.config_records["secaggplus_configs"] = ConfigRecord({})
        asks.append(Message(content, dst_node_id=n, message_type="train.default"))
    for reply in grid.send_and_receive(asks, timeout=60):
        if reply.has_error():
            got["train.default"].append({"refused": reply.error.reason})
            continue
        res = compat.recorddict_to_fitres(reply.content, keep_input=True)
        (limbs,) = parameters_to_ndarrays(res.parameters)
        got["train.default"].append({"limbs": limbs.tolist()})
    with open(context.run_config["out"], "w") as f:
        json.dump(got, f)
"""
OPTIONS = {  # what the attacker's request carries (messages.option_keys())
    k: v
    for k, v in ScoreOptions(metrics=("kd",), kernel_params={}, dtype="float64").as_dict().items()
    if k in option_keys()
}
SERVER = SERVER.replace("{OPTIONS!r}", repr(OPTIONS))
STOCK = """\
from flwr.app import Message
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.compat.common import recorddict_compat as compat

from distrank.flower import site as site_app
from distrank.flower.node import SiteConfig
from distrank.flower.secure import site as secure_site
from distrank.metrics._options import ScoreOptions

app = ClientApp()  # distrank's site as routed before: no check of the exact type
app.query(mods=[secure_site.guard_mod])(site_app.query)


@app.train(mods=[secure_site.guard_mod, secure_site.policy_mod, secaggplus_mod])
def train(msg, context):
    site = SiteConfig.from_node_config(context.node_config)
    limbs = context.state.array_records.pop(secure_site.STATE)["limbs"].numpy()  # old share()
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([limbs]), 1, {"site-id": site.site})
    return Message(compat.fitres_to_recorddict(res, keep_input=False), reply_to=msg)
"""


def attack_app(root, name: str, clientapp: str, modules: dict[str, str]):
    app = root / f"attack-{name}"
    (app / "attack").mkdir(parents=True)
    (app / "pyproject.toml").write_text(PYPROJECT.format(name=name, clientapp=clientapp))
    for module, text in {"__init__": "", "server": SERVER, **modules}.items():
        (app / "attack" / f"{module}.py").write_text(text)
    return app, hashlib.sha256(build_fab_from_disk(app)).hexdigest()


def test_train_default_gets_every_sites_vector_before_and_nothing_now(tmp_path, federation):
    sites, _ = federation
    before = attack_app(tmp_path, "before", "attack.stock:app", {"stock": STOCK})
    now = attack_app(tmp_path, "now", "distrank.flower.site:app", {})
    peers = pin_keys(tmp_path, sites)
    extra = {
        s: f'signing-key="{tmp_path / s}.key" peers="{peers}" feature-bound=12.0 max-rows=1000'
        for s in sites
    }
    command = (*PINNED, "--pin-fab", before[1], "--pin-fab", now[1])
    net, _ = Loopback.of_arrays(tmp_path, sites, {}, supernode=command, extra=extra)
    got = {}
    try:
        for name, (app, _) in (("before", before), ("now", now)):
            out = tmp_path / f"{name}.json"
            run = net.wait_finished(net.run({"out": str(out)}, app=app), timeout=240)
            assert run["status"] == "finished:completed", run
            got[name] = json.loads(out.read_text())
    finally:
        net.close()
    for name in ("before", "now"):
        assert got[name]["round 1"] == ["", "", ""]  # every site prepared its vector
    models = {"m": np.random.default_rng(0).normal(size=(40, 6))}  # the attacker's plan
    plan = secure.Plan(
        ("m",),
        ("kd",),
        6,
        "size",
        12.0,
        1000,
        secure.kernel_bound("poly", {}, 6, 12.0),
        threshold=2,
    )
    centre = secure.public_centre(models)
    stolen = [secure.decode(np.array(r["limbs"]), 1, plan) for r in got["before"]["train.default"]]
    truth = [secure_site.site_vector(x, models, OPTIONS, plan, centre) for x in sites.values()]
    assert len(stolen) == 3
    grid = secure.entry_scales(plan) * secure.GRID_ERROR  # the quantisation's bound
    for v, t in zip(sorted(stolen, key=lambda v: v[0]), sorted(truth, key=lambda v: v[0])):
        assert np.all(np.abs(v - t) <= grid)  # n_i and n_i KD_i: the site's vector
    assert got["now"]["train.default"] == [{"refused": "refused"}] * 3
