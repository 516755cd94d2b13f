"""Issue 48's attacks, replayed against the site's release policy (``flower.policy``).

Each test plays a server that deviates (or a coordinator with members of its own) the
way the review did, and asserts what the site releases now: only what its policy names
as public or noise, with the noise its own policy derives from the request.
"""

from __future__ import annotations

import json
import math
import multiprocessing

import numpy as np
import pandas as pd
import pytest
from dp_accounting import get_sigma_gaussian
from secure_run import BOUND, RBF_KD, run_secure, save

from distrank.flower.federation import FederationError
from distrank.flower.ledger import Ledger
from distrank.flower.messages import decode_reply, encode_request
from distrank.flower.node import SiteConfig
from distrank.flower.policy import Policy, Refused
from distrank.flower.secure import plan as secure
from distrank.flower.secure import site as secure_site
from distrank.flower.secure.server import bounds_path
from distrank.flower.site import score_site
from distrank.metrics._table import meta_path

OPTIONS = RBF_KD
NOISE = {"epsilon": 1.0, "delta": 1e-5}


def secure_plan(models, metrics=("kd",), **changes) -> secure.Plan:
    plan = secure.Plan(tuple(models), tuple(metrics), 6, "size", BOUND, 1000, BOUND**2)
    return secure.Plan(**(plan.__dict__ | {"room": (("kd", 1e12), ("rows", 1e12))} | changes))


def test_a_linear_kernel_to_a_noised_site_is_refused_or_gets_noise_for_its_range(federation):
    """Before: noise for a bounded kernel's 4 per model while n_i KD_i moved by ~456.
    Now: the default policy accepts rbf and laplace only; a policy that accepts the
    linear kernel calibrates for 4 (hi - lo) = 8 F^2 per model, its range on the ball."""
    _, models = federation
    linear = OPTIONS | {"kernel": "linear", "kernel_params": {}}
    site = Policy(feature_bound=BOUND, max_rows=1000, **NOISE)
    with pytest.raises(Refused, match="'noise-kernels' are"):
        secure_site.check_plan(site, secure_plan(models), models, linear, np.zeros(6))
    site = Policy(feature_bound=BOUND, max_rows=1000, noise_kernels=("linear",), **NOISE)
    stds, sens, share = secure_site.check_plan(
        site, secure_plan(models), models, linear, np.zeros(6)
    )
    assert sens["kd"] == pytest.approx(8 * BOUND**2 * math.sqrt(len(models)))
    z = get_sigma_gaussian(1.0, 1e-5) * math.sqrt(2)  # kd and rows blocks
    assert stds["kd"] == pytest.approx(z * sens["kd"] / math.sqrt(share), rel=1e-6)


def test_an_fd_centre_of_the_servers_choice_is_checked_before_the_data(
    tmp_path, federation, server_process
):
    """Before: a centre far out made S1 leave its range for some sites and not others
    ("out of bounds" vs a reply: n_i, mean and variance from ~180 runs). Now: a centre
    outside the site's ball is refused before any data is read, and rows are clipped,
    so a centre inside it never puts a value out of range: two sites of different rows,
    counts and means answer every centre alike."""
    sites, models = federation
    plan = secure_plan(models, ("fd",), room=())
    site = Policy(feature_bound=BOUND, max_rows=1000, share_stats=True)
    for centre in (np.full(6, BOUND), np.r_[BOUND * 1.01, np.zeros(5)]):
        with pytest.raises(Refused, match="the centre is no point of this site's ball"):
            secure_site.check_plan(site, plan, models, OPTIONS, centre)
    rng = np.random.default_rng(3)
    for _ in range(20):
        centre = rng.normal(size=6)
        centre *= BOUND * rng.uniform(0, 1) / np.linalg.norm(centre)
        secure_site.check_plan(site, plan, models, OPTIONS, centre)
        for x in (sites["oslo"], 30 * sites["rome"][:7]):  # 60 vs 7 rows, far out
            vector = secure_site.site_vector(site.clip(x), models, OPTIONS, plan, centre)
            assert np.all(np.abs(vector) <= secure.entry_scales(plan))  # never out of range


def test_plain_sketches_open_no_plain_scores_and_plain_scores_spend_the_budget(
    tmp_path, federation
):
    """Before: ``secure-only = false`` (for plain sketches) opened exact plain scores,
    n_i and the moments, with no noise or ledger entry, also past the budget. Now each
    plain answer is opened on its own, and one opened under noise is noised, recorded
    and refused past the budget."""
    sites, models = federation
    (path,) = save(tmp_path, {"oslo": sites["oslo"]}).values()
    request = encode_request(models, OPTIONS)
    sketch_only = SiteConfig("oslo", path, Policy(plain=("sketch",), share_stats=True))
    assert decode_reply(score_site(sketch_only, request)).error == (
        "Refused: this site's policy gives no plain scores"
    )
    ledger = tmp_path / "oslo.ledger"
    policy = Policy(plain=("scores",), share_stats=True, budget=1.2, ledger=ledger, **NOISE)
    noisy = SiteConfig("oslo", path, policy)
    first = decode_reply(score_site(noisy, request, run=1))
    exact = decode_reply(score_site(SiteConfig("oslo", path, Policy(plain=("scores",))), request))
    assert first.stats is None  # the moments leave only exact, so not under noise
    assert first.n != exact.n or first.scores != exact.scores  # noised
    (entry,) = Ledger(ledger, 1.2, 1e-5).entries()
    assert (entry["path"], entry["what"], entry["run"]) == ("scores", ["kd"], 1)
    assert entry["spent"] == pytest.approx(1.0, rel=1e-6)
    again = decode_reply(score_site(noisy, request, run=2))
    assert again.error.startswith("Refused: this release would spend epsilon")
    assert first.attested["noise"]["kd"] > 0 and first.attested["path"] == "scores"


def test_every_released_block_is_noised_or_refused(federation):
    """Before: a plan noising only KD, to a site with a budget but no noise-epsilon, got
    FD_all and Recall exactly while the ledger recorded one KD release. Now a budget needs
    noise-epsilon, and under noise the site noises every block itself (Recall: 1 per
    model) and refuses a block with no bound (FD's moments)."""
    _, models = federation
    with pytest.raises(ValueError, match="'budget-epsilon' needs 'noise-epsilon'"):
        Policy.from_config({"budget-epsilon": 1.0, "noise-delta": 1e-5, "ledger": "/l"})
    site = Policy(feature_bound=BOUND, max_rows=1000, share_stats=True, **NOISE)
    room = (("kd", 1e12), ("recall", 1e12), ("rows", 1e12))
    plan = secure_plan(models, ("kd", "recall"), room=room)
    stds, sens, _ = secure_site.check_plan(site, plan, models, OPTIONS, np.zeros(6))
    assert set(stds) == {"kd", "recall", "rows"}
    assert sens["recall"] == pytest.approx(math.sqrt(len(models)))
    fd = secure_plan(models, ("kd", "fd"))
    with pytest.raises(Refused, match=r"blocks \['sum', 'scatter'\] have no bounded"):
        secure_site.check_plan(site, fd, models, OPTIONS, np.zeros(6))


def _spend(args) -> bool:
    path, start = args
    import time

    while time.time() < start:  # all eight at once
        time.sleep(0.0005)
    try:
        Ledger(path, 1.2, 1e-5).record(0, _Z, path="secure")
        return True
    except ValueError:
        return False


_Z = get_sigma_gaussian(1.0, 1e-5)  # one release of epsilon 1: a budget of 1.2 allows one


def test_eight_concurrent_spends_against_a_budget_of_one_release(tmp_path):
    """Before: check, then append, unlocked; 2 to 5 of 8 concurrent spends passed. Now the
    check and the append hold one lock: exactly one passes, and the file has one entry."""
    import time

    path = tmp_path / "site.ledger"
    context = multiprocessing.get_context("fork")
    with context.Pool(8) as pool:
        passed = pool.map(_spend, [(path, time.time() + 0.5)] * 8)
    assert sum(passed) == 1
    (entry,) = Ledger(path, 1.2, 1e-5).entries()
    assert entry["spent"] == pytest.approx(1.0, rel=1e-6)


def test_n_i_is_noised_unless_the_policy_declares_it_public(federation):
    """Before: two noisy runs, with and without one site, gave its n_i exactly (the rows
    entry was never noised). Now, under noise, the rows entry gets the site's noise for
    sensitivity 1 (one row more or less) by default, and leaves exactly only where the
    policy declares ``rows = "public"``."""
    sites, models = federation
    plan = secure_plan(models)
    z = get_sigma_gaussian(1.0, 1e-5) * math.sqrt(2)  # blocks kd and rows
    site = Policy(feature_bound=BOUND, max_rows=1000, **NOISE)
    assert site.rows == "noise"  # the default under noise
    stds, _, share = secure_site.check_plan(site, plan, models, OPTIONS, np.zeros(6))
    assert stds["rows"] == pytest.approx(z / math.sqrt(share), rel=1e-6)
    x = sites["rome"]
    vector = secure_site.site_vector(x, models, OPTIONS, plan, None)
    rng = np.random.default_rng(0)
    released = [secure_site.add_noise(vector, plan, stds, rng)[0] for _ in range(200)]
    assert vector[0] == len(x) and np.std(released) == pytest.approx(stds["rows"], rel=0.2)
    public = Policy(feature_bound=BOUND, max_rows=1000, rows="public", **NOISE)
    stds, _, _ = secure_site.check_plan(public, plan, models, OPTIONS, np.zeros(6))
    assert "rows" not in stds


def test_a_run_config_claiming_epsilon_claims_nothing_the_sites_did_not_attest(
    tmp_path, federation, server_process
):
    """Before: default sites (no noise) and a run config of epsilon 1 gave exact sums
    while the meta and ``noise_std`` claimed epsilon 1. Now both say no noise."""
    asked = {"metrics": "kd", "kernel": "rbf", "kernel-params": "bandwidth=3"}
    _, out = run_secure(
        tmp_path, *federation, **asked, **{"noise-epsilon": 1.0, "noise-delta": 1e-5}
    )
    meta = json.loads(meta_path(out).read_text())
    assert meta["privacy"]["noise"] == "none"
    assert set(meta["privacy"]["sites"].values()) == {"no noise"}
    assert (pd.read_csv(bounds_path(out)).noise_std == 0).all()


def test_a_site_refuses_a_threshold_that_leaves_no_honest_site_beside_its_colluders(
    tmp_path, federation, server_process
):
    """Before: with t = k and c members of its own, the honest noise was (k - c)/k of
    sigma^2. Now a site of ``colluders`` c adds sigma^2 / (t - c) (see
    test_colluders_raise_each_honest_sites_share) and refuses t <= c."""
    node = {"noise-epsilon": 1.0, "noise-delta": 1e-5, "colluders": 3}
    asked = {"metrics": "kd", "kernel": "rbf", "kernel-params": "bandwidth=3"}
    asked |= {"noise-epsilon": 1.0, "noise-delta": 1e-5, "secure-threshold": 3}
    with pytest.raises(FederationError) as err:
        run_secure(tmp_path, *federation, node=node, **asked)
    assert str(err.value) == "; ".join(f"site {s!r} failed: refused" for s in federation[0])
