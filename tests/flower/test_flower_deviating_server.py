"""A server that deviates from the protocol, played attack by attack (issue: secure mode
against a deviating server). Each test shows what the attacker gets with the check
it defeats turned off (Flower's stock behaviour, or distrank's before the check) and
what it gets now: the site's own state is the truth it is compared with. The foreign
app that a coordinator ships is played over real processes in
``test_flower_pinned_app.py``."""

from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message
from flwr.client.mod import secaggplus_mod
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.clientapp import ClientApp
from flwr.common import bytes_to_ndarray, parameters_to_ndarrays
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    Key,
    Stage,
)
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_separate
from flwr.compat.common import recorddict_compat as compat
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)
from secure_run import BOUND, run, run_secure, secure_setup

from distrank.flower import masks
from distrank.flower import site as site_app
from distrank.flower.federation import FederationError
from distrank.flower.identity import verify_attestation
from distrank.flower.secure import plan as secure
from distrank.flower.secure import site as secure_site
from distrank.metrics._privacy import noise_multiplier
from distrank.metrics._table import meta_path


def state_of(grid, node) -> SecAggPlusState:
    return SecAggPlusState(**grid.contexts[node].state.config_records[RECORD_KEY_STATE])


# -- 1. a message type the guards do not see -------------------------------------------------


def old_share(site_id, msg, state):
    """distrank's share() before this change: the stored vector to any train-routed message."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.compat.common import recorddict_compat as compat

    limbs = state.array_records.pop(secure_site.STATE)["limbs"].numpy()
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([limbs]), 1, {"site-id": site_id})
    return compat.fitres_to_recorddict(res, keep_input=False)


def stock_routing_app(share) -> ClientApp:
    """The site's functions as Flower routes them with no check of the exact type."""
    app = ClientApp()
    app.query(mods=[secure_site.guard_mod])(site_app.query)

    @app.train(mods=[secure_site.guard_mod, secure_site.policy_mod, secaggplus_mod])
    def train(msg, context):
        site = secure_site.SiteConfig.from_node_config(context.node_config)
        return Message(share(site.site, msg, context.state), reply_to=msg)

    return app


def round_one(tmp_path, federation, **config):
    """A secure run's round-1 request and the contexts of its sites, nothing sent yet."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    grid, run_config = secure_setup(tmp_path, *federation, **config)
    sent = []

    def keep(stage, msg):
        sent.append(msg)
        raise _Stop

    grid.tamper = keep
    with pytest.raises(_Stop):
        run(grid, run_config)
    return grid, sent[0]


class _Stop(Exception):
    pass


def ask(app, grid, node, request, message_type):
    """``app``'s reply at ``node`` to ``request`` sent as ``message_type`` (for a train
    type, with an empty SecAgg+ configs record, as an attacker would send it)."""
    content = request.content.copy()
    if message_type.startswith("train"):
        content.config_records[RECORD_KEY_CONFIGS] = ConfigRecord({})
    msg = Message(content, dst_node_id=node, message_type=message_type)
    return app(msg, grid.contexts[node])


@pytest.mark.parametrize("app", ["stock routing, old share", "now"])
def test_train_default_after_round_one_gets_the_vector_only_under_stock_routing(
    tmp_path, federation, server_process, app
):
    grid, request = round_one(tmp_path, federation, metrics="kd,recall")
    target = stock_routing_app(old_share) if app != "now" else site_app.app
    assert not ask(target, grid, 100, request, "query").has_error()
    stored = grid.contexts[100].state.array_records[secure_site.STATE]["limbs"].numpy().copy()
    reply = ask(target, grid, 100, request, "train.default")
    if app == "now":
        assert reply.has_error() and reply.error.reason == "refused"
        # the second layer: Flower's routing with today's share() refuses it too
        again = ask(stock_routing_app(secure_site.share), grid, 100, request, "train.default")
        assert again.has_error() and again.error.reason == "refused"
        return
    res = compat.recorddict_to_fitres(reply.content, keep_input=True)
    (limbs,) = parameters_to_ndarrays(res.parameters)
    assert np.array_equal(limbs, stored)  # oslo's vector, unmasked


def test_a_second_round_one_query_in_a_run_is_refused(tmp_path, federation, server_process):
    """With noise on, each query would draw fresh noise, and their mean would remove it."""
    grid, request = round_one(tmp_path, federation, metrics="kd")
    first = ask(site_app.app, grid, 100, request, "query")
    second = ask(site_app.app, grid, 100, request, "query")
    assert first.content.config_records["site"]["error"] == ""
    assert second.content.config_records["site"]["error"] == "refused"
    grid.contexts[100].run_id = 2  # a new run may ask again
    assert (
        ask(site_app.app, grid, 100, request, "query").content.config_records["site"]["error"] == ""
    )


# -- 3. live neighbours declared dead -----------------------------------------------------------


def masked_vector_and_shares(grid, node):
    """What the server received: ``node``'s masked vector, and the unmask shares by owner."""
    shares, masked = {}, None
    for stage, msg in grid.received:
        if msg.has_error():
            continue
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS, {})
        if stage == Stage.COLLECT_MASKED_VECTORS and msg.metadata.src_node_id == node:
            masked = [bytes_to_ndarray(b) for b in configs[Key.MASKED_PARAMETERS]]
        if stage == Stage.UNMASK:
            for owner, piece in zip(configs[Key.NODE_ID_LIST], configs[Key.SHARE_LIST]):
                shares.setdefault(owner, []).append(piece)
    return masked, shares


FIVE = {f"s{i}": np.random.default_rng(i).normal(size=(40 + 5 * i, 6)) for i in range(5)}


@pytest.mark.parametrize("views", ["unchecked", "checked"])
def test_live_peers_declared_dead_unmask_one_site_only_without_the_view_check(
    tmp_path, federation, server_process, monkeypatch, views
):
    """Five sites, threshold 3. The server forwards the victim (node 100) only two peers'
    key shares, so it masks with those two alone; then it asks for the victim's private
    seed and, naming those two dead, for their keys."""
    if views == "unchecked":
        monkeypatch.setattr(secure_site, "check_views", lambda *a, **k: None)
    victim, clique, prepared = 100, [101, 102], []

    def attack(stage, msg):
        configs = msg.content.config_records[RECORD_KEY_CONFIGS] if stage != "query" else None
        if stage == Stage.SETUP and not prepared:  # the truth: what the victim prepared
            prepared.append(grid.contexts[victim].state.array_records[secure_site.STATE])
        if stage == Stage.COLLECT_MASKED_VECTORS and msg.metadata.dst_node_id == victim:
            keep = [i for i, s in enumerate(configs[Key.SOURCE_LIST]) if s in clique]
            for key in (Key.SOURCE_LIST, Key.CIPHERTEXT_LIST):
                configs[key] = [configs[key][i] for i in keep]
        if stage == Stage.UNMASK:
            configs[Key.ACTIVE_NODE_ID_LIST] = [100, 103, 104]
            configs[Key.DEAD_NODE_ID_LIST] = clique

    grid, run_config = secure_setup(
        tmp_path, FIVE, federation[1], tamper=attack, metrics="kd", node={"min-sites": 3}
    )
    with contextlib.suppress(Exception):  # what the server makes of the sum is no matter
        run(grid, run_config)
    masked, shares = masked_vector_and_shares(grid, victim)
    if views == "checked":
        assert shares == {}
        assert [e for e in grid.errors() if e[0] == Stage.UNMASK] == [(Stage.UNMASK, "refused")] * 5
        return
    assert all(len(shares[n]) >= 3 for n in (victim, *clique))
    seed, shapes = combine_shares(shares[victim]), [a.shape for a in masked]
    vector = [
        (a - m) % secure.MODULUS for a, m in zip(masked, masks.expand(seed, secure.MODULUS, shapes))
    ]
    pk1 = state_of(grid, victim).pk1
    for peer in clique:
        key = generate_shared_key(
            bytes_to_private_key(combine_shares(shares[peer])), bytes_to_public_key(pk1)
        )
        vector = [
            (a + m) % secure.MODULUS
            for a, m in zip(vector, masks.expand(key, secure.MODULUS, shapes))
        ]
    truth = np.rint((prepared[0]["limbs"].numpy() + 1) * 2**29).astype(np.int64)
    assert np.array_equal(vector[1], truth)  # the victim's whole vector, alone


# -- 4. substituted keys -------------------------------------------------------------------------


@pytest.mark.parametrize("keys", ["unchecked", "checked"])
def test_keys_the_server_made_get_it_the_victims_secrets_only_without_signatures(
    tmp_path, federation, server_process, monkeypatch, keys
):
    """The server gives the victim its own key pairs in place of the victim's peers',
    then decrypts the key shares the victim encrypts to them: its private seed and its
    first secret key, which unmask its vector."""
    if keys == "unchecked":
        monkeypatch.setattr(secure_site, "check_keys", lambda *a, **k: None)
    victim, fake = 100, {}

    def attack(stage, msg):
        if stage == Stage.SHARE_KEYS and msg.metadata.dst_node_id == victim:
            configs = msg.content.config_records[RECORD_KEY_CONFIGS]
            for nid in [k for k in configs if k not in (Key.STAGE, str(victim))]:
                pairs = [generate_key_pairs() for _ in range(2)]
                fake[int(nid)] = [private_key_to_bytes(sk) for sk, _ in pairs]
                configs[nid] = [public_key_to_bytes(pk) for _, pk in pairs]

    grid, run_config = secure_setup(tmp_path, *federation, tamper=attack, metrics="kd")
    with pytest.raises(FederationError):
        run(grid, run_config)
    sent = [
        msg.content.config_records[RECORD_KEY_CONFIGS]
        for stage, msg in grid.received
        if stage == Stage.SHARE_KEYS and msg.metadata.src_node_id == victim and not msg.has_error()
    ]
    if keys == "checked":
        assert sent == [] and (Stage.SHARE_KEYS, "refused") in grid.errors()
        return
    (configs,) = sent
    own = state_of(grid, victim)
    b_shares, sk1_shares = [], []
    for dst, ciphertext in zip(configs[Key.DESTINATION_LIST], configs[Key.CIPHERTEXT_LIST]):
        key = generate_shared_key(bytes_to_private_key(fake[dst][1]), bytes_to_public_key(own.pk2))
        _, _, b, sk1 = share_keys_plaintext_separate(decrypt(key, ciphertext))
        b_shares.append(b)
        sk1_shares.append(sk1)
    assert combine_shares(b_shares) == own.rd_seed and combine_shares(sk1_shares) == own.sk1


# -- 5. noise chosen by the server ----------------------------------------------------------------

NOISY = {"metrics": "kd", "kernel": "rbf", "kernel-params": "bandwidth=3"}
SITE_NOISE = {"noise-epsilon": 1.0, "noise-delta": 1e-5}


def test_a_site_adds_its_own_noise_and_meta_says_what_it_attested(
    tmp_path, federation, server_process
):
    """The noise is the site's: a plan that asks for none, or for less, leaves no range
    for it and is refused; with room, each site adds the noise of its own policy and
    signs what it added, which the meta reports (with the signature, checked here)."""
    for asked in ({}, {"noise-epsilon": 10.0, "noise-delta": 1e-5}):  # none, too little
        with pytest.raises(FederationError) as err:
            run_secure(tmp_path, *federation, node=SITE_NOISE, **NOISY, **asked)
        assert str(err.value) == "; ".join(f"site {s!r} failed: refused" for s in federation[0])
    _, out = run_secure(tmp_path, *federation, node=SITE_NOISE, **NOISY, **SITE_NOISE)
    meta = json.loads(meta_path(out).read_text())
    attested = meta["secure"]["attested"]
    assert set(attested) == set(federation[0])
    z = noise_multiplier(epsilon=1.0, delta=1e-5) * math.sqrt(2)  # blocks kd and rows
    for site, said in attested.items():
        assert said["noise-epsilon"] == 1.0 and said["noise-delta"] == 1e-5
        # rbf: n_i KD_i moves by 4 per model (2 models), n_i by 1; t = 2 of 3, c = 0
        assert said["noise"]["kd"] == pytest.approx(z * 4 * math.sqrt(2) / math.sqrt(2))
        assert said["noise"]["rows"] == pytest.approx(z / math.sqrt(2))
        peers = tmp_path / "peers.json"
        assert verify_attestation(said, peers) == site
    assert meta["privacy"]["sites"]["oslo"].startswith("(epsilon 1, delta 1e-05)")


def test_the_ledger_refuses_a_run_past_the_sites_budget(tmp_path, federation, server_process):
    """Budget epsilon 1.2 at delta 1e-5: one run at epsilon 1 fits, a second does not
    (two Gaussian releases of epsilon 1 compose to more)."""
    node = SITE_NOISE | {"budget-epsilon": 1.2, "ledger": "set below"}
    for run_id in (1, 2):
        root = tmp_path / f"run{run_id}"
        root.mkdir()
        grid, config = secure_setup(root, *federation, node=node, **NOISY, **SITE_NOISE)
        for ctx in grid.contexts.values():
            ctx.node_config["ledger"] = str(tmp_path / f"{ctx.node_config['site-id']}.ledger")
            ctx.run_id = run_id
        if run_id == 1:
            run(grid, config)
            continue
        with pytest.raises(FederationError, match="failed: refused"):
            run(grid, config)
    for site in federation[0]:
        lines = (tmp_path / f"{site}.ledger").read_text().splitlines()
        (entry,) = [json.loads(line) for line in lines]
        assert entry["run"] == 1 and entry["what"] == ["kd"] and entry["path"] == "secure"
        assert entry["spent"] == pytest.approx(1.0, rel=1e-6)


# -- 6. refusals as an oracle -----------------------------------------------------------------------


def test_no_answer_depends_on_the_sites_rows_or_norms(tmp_path, federation, server_process):
    """The server varies its public max-rows and feature-bound. Before, a site's answer
    followed its n_i and its largest norm (the plan's bounds against its data); now it
    follows the site's own public bounds only: two sites with different rows, counts
    and norms but the same node config answer every request alike."""
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(100, 6))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    small, large = 3.0 * rows[:60], 10.0 * rows  # largest norms 3 and 10, 60 and 100 rows
    models = {"sharp": federation[1]["sharp"]}  # norms <= 4.2
    requests = [{"max-rows": r} for r in (50, 59, 61, 99, 101, 1000)]
    requests += [{"feature-bound": b} for b in (5.0, 8.0, BOUND, 20.0)]
    node = {"feature-bound": BOUND, "max-rows": 1000}
    answers, before = {}, {}
    for name, x in (("small", small), ("large", large)):
        answers[name], before[name] = [], []
        for i, asked in enumerate(requests):
            three = {"oslo": x, "paris": x, "rome": x}
            grid, request = round_one(
                tmp_path / f"{name}{i}", (three, models), node=node, metrics="kd", **asked
            )
            reply = ask(site_app.app, grid, 100, request, "query")
            answers[name].append(reply.content.config_records["site"]["error"])
            plan = secure.Plan.from_config(request.content.config_records["secure"])
            try:  # the old check: the plan's bounds against the data
                secure_site.site_vector(x, {}, {}, plan, None)
                before[name].append("")
            except secure.OutOfBounds:
                before[name].append("out of bounds")
            except Exception:  # noqa: BLE001 -- past the bounds: scoring nothing
                before[name].append("")
    assert before["small"] != before["large"]  # the oracle
    assert answers["small"] == answers["large"]
    assert answers["small"] == ["refused"] * 5 + [""] + ["refused"] * 2 + ["", ""]
