"""Secure mode under attack: each test plays the server (or watches what it receives) and
shows what it can and cannot learn of a site: the masks' generator, the failure
messages, a deviating server's requests, and the noise of the released KD_avg."""

from __future__ import annotations

import importlib
import json
import math
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from dp_accounting import get_sigma_gaussian
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common.secure_aggregation import secaggplus_utils
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    Key,
    Stage,
)
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key
from scipy import stats
from secure_run import (
    BOUND,
    RBF_KD,
    STAGES,
    flower_sum,
    private_masks_removed,
    run,
    run_secure,
    secure_setup,
    site_integers,
)

from distrank.flower import masks
from distrank.flower.federation import FederationError
from distrank.flower.secure import plan as secure
from distrank.flower.secure import site as secure_site
from distrank.flower.secure.server import bounds_path, secure_table
from distrank.metrics import score
from distrank.metrics._table import meta_path

STOCK = secaggplus_utils.pseudo_rand_gen  # Flower 1.42's generator: a 32-bit fold of the seed


def fold(seed: bytes) -> int:
    """The 32-bit seed Flower's generator makes of a secret."""
    out = 0
    for i in range(0, len(seed), 4):
        out ^= int.from_bytes(seed[i : i + 4], "little")
    return out


def test_seeds_with_equal_32_bit_folds_give_different_masks():
    a, b = bytes(8), (1).to_bytes(4, "little") * 2  # both fold to 0
    assert fold(a) == fold(b) == 0
    shapes = [(1,), (1000,)]
    assert all(
        np.array_equal(x, y) for x, y in zip(STOCK(a, 2**40, shapes), STOCK(b, 2**40, shapes))
    )
    ours_a, ours_b = masks.expand(a, 2**40, shapes), masks.expand(b, 2**40, shapes)
    assert np.mean(ours_a[1] == ours_b[1]) == 0.0 and ours_a[0] != ours_b[0]
    assert all(m.dtype == np.int64 and m.min() >= 0 and m.max() < 2**40 for m in ours_a)


def test_the_masks_are_shake256_of_the_whole_seed():
    """FIPS 202's SHAKE-256 (hashlib) of the domain and the seed, 8 bytes per entry."""
    import hashlib

    seed = bytes(range(44))
    stream = hashlib.shake_256(b"distrank secure mode, SecAgg+ mask, v1\x00" + seed).digest(24)
    words = [int.from_bytes(stream[i : i + 8], "little") % 2**40 for i in (0, 8, 16)]
    scalar, pair = masks.expand(seed, 2**40, [(), (2,)])
    assert scalar.shape == () and [int(scalar), *pair.tolist()] == words
    with pytest.raises(ValueError, match=r"num_range: expected a power of two .* got 1000"):
        masks.expand(seed, 1000, [(2,)])


def test_the_generator_is_in_force_once_distrank_flower_is_imported():
    code = (
        "import importlib, distrank.flower as f; from distrank.flower import masks; "
        "print([importlib.import_module(m).pseudo_rand_gen is masks.expand for m in masks.CALLERS])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[-2] == "[True, True]"


def search(target: int, generator, around: int, span: int = 2**18):
    """The 32-bit seed (among those whose bits 7, 15, 23, 31 are 0, as every fold of a
    base64 key) within ``span`` of ``around`` whose first mask entry is ``target``."""
    low = max(0, around - span // 2)
    for c in range(low, low + span):
        if not c & 0x80808080:
            if generator(c.to_bytes(4, "little"), secure.MODULUS, [(1,)])[0][0] == target:
                return c
    return None


@pytest.mark.parametrize("generator", ["stock", "ours"])
def test_a_two_site_sum_a_protocol_following_server_unmasks_only_under_stock_masks(
    tmp_path, federation, server_process, monkeypatch, generator
):
    """The server removes oslo's private mask (its seed is legitimately reconstructed) and
    searches the pairwise key's 32-bit fold for Flower's known weight factor 2^30. Under
    Flower's generator it finds the key and so oslo's whole vector and n_i; under ours the
    same search over the same window finds nothing."""
    sites, models = federation
    two = {s: sites[s] for s in ("oslo", "paris")}
    expand = STOCK if generator == "stock" else masks.expand
    if generator == "stock":  # distrank before this change: Flower's own generator
        for name in masks.CALLERS:
            monkeypatch.setattr(importlib.import_module(name), "pseudo_rand_gen", STOCK)
        monkeypatch.setattr(masks, "installed", lambda: True)
    grid, out = run_secure(tmp_path, two, models)
    assert out.exists()  # the run itself succeeds either way
    factor, vector = private_masks_removed(grid, expand)["oslo"]  # = v - pairwise (node 100)
    target = int((secure.LEVELS - factor[0]) % secure.MODULUS)  # the pairwise mask's entry 0
    oslo = SecAggPlusState(**grid.contexts[100].state.config_records[RECORD_KEY_STATE])
    key = generate_shared_key(
        bytes_to_private_key(oslo.sk1), bytes_to_public_key(oslo.public_keys_dict[101][0])
    )
    assert fold(key) & 0x80808080 == 0  # base64: 28 bits of entropy in the fold
    truth = site_integers(two, models)["oslo"]
    if generator == "ours":  # the same search, through Flower's fold, finds nothing ...
        assert search(target, STOCK, around=fold(key)) is None
        assert np.mean(vector == truth) < 0.01  # what is left is not the vector
        _, pairwise = masks.expand(key, secure.MODULUS, [(1,), vector.shape])
        assert np.array_equal((vector + pairwise) % secure.MODULUS, truth)  # v - SHAKE(key)
        return
    found = search(target, expand, around=fold(key))
    assert found == fold(key)
    _, pairwise = expand(found.to_bytes(4, "little"), secure.MODULUS, [(1,), vector.shape])
    recovered = (vector + pairwise) % secure.MODULUS
    assert np.array_equal(recovered, truth)  # oslo's whole vector
    half = len(recovered) // 2
    w = (int(recovered[0]) << secure.LIMB) + int(recovered[half]) - secure.HALF
    assert w * secure.scale_above(1000) / secure.HALF == len(two["oslo"]) == 60  # its n_i


def test_removing_the_private_masks_leaves_each_vector_under_pairwise_masks(
    tmp_path, federation, server_process
):
    """Every message the server receives: round 1 says only who is ready; SecAgg+ brings
    public keys, encrypted shares, masked vectors and the private-mask seeds of the sites
    whose vectors it holds. Removing the private masks, the server holds each site's
    vector under its pairwise masks, which add up to zero over the sites only."""
    sites, models = federation
    grid, _ = run_secure(tmp_path, sites, models)
    encoded = site_integers(sites, models)
    by_stage: dict[str, list] = {}
    for stage, msg in grid.received:
        assert not msg.has_error(), msg.error
        by_stage.setdefault(stage, []).append(msg)
    assert {k: len(v) for k, v in by_stage.items()} == dict.fromkeys(STAGES[:5], 3)
    for msg in by_stage["query"]:  # round 1: no numbers
        assert not msg.content.array_records
        assert set(msg.content.config_records["site"]) == {"site-id", "moments", "error"}
    for msg in by_stage[Stage.COLLECT_MASKED_VECTORS]:
        content = msg.content
        assert all(not record for record in content.array_records.values())  # cleared
        assert dict(content.config_records["fitres.metrics"]) == {
            "site-id": grid.site_of(msg.metadata.src_node_id)
        }
        assert content.metric_records["fitres.num_examples"]["num_examples"] == 1  # not n_i
    residual = {s: v for s, (_, v) in private_masks_removed(grid, masks.expand).items()}
    total = sum(encoded.values())
    assert np.array_equal(sum(residual.values()) % secure.MODULUS, total)  # the sum, exactly
    for name, z in encoded.items():
        left = residual[name]
        assert np.mean(left == z) < 0.01  # the site's vector is not what is left,
        assert np.mean(left <= secure.LEVELS) < 0.05  # nor anything a site could send:
        for other in sites:  # nor its pairwise masks, minus any other site's vector
            assert np.mean((left - encoded[other]) % secure.MODULUS <= secure.LEVELS) < 0.05


# -- failures say nothing ------------------------------------------------------------------


def missing_features(grid, tmp_path):
    grid.contexts[100].node_config["features"] = str(tmp_path / "site-37" / "rows-60.npz")


def nan_row(grid, tmp_path):
    x = np.load(grid.contexts[100].node_config["features"])["features"]
    x[17, 2] = np.nan
    np.savez(grid.contexts[100].node_config["features"], features=x)


FAILURES = {  # category: (run config, node config, change to the grid, failing stage)
    "refused (rows)": ({"kd-estimator": "subsets", "subset-size": 65}, {}, None, "query"),
    "refused (bounds)": ({"max-rows": 50}, {}, None, "query"),
    "bad input (own bounds)": ({}, {"min-rows": 65}, None, "query"),
    "bad input": ({}, {}, nan_row, "query"),
    "bad input (a path)": ({}, {}, missing_features, "query"),
    "refused": ({}, {"min-sites": 4}, None, Stage.SHARE_KEYS),
    "internal": ({}, {}, "raise", "query"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_failing_site_says_only_its_category(
    case, tmp_path, federation, server_process, monkeypatch, caplog
):
    config, node, change, stage = FAILURES[case]
    if change == "raise":  # an unforeseen failure, whose message holds a path and a count
        message = f"internal error at {tmp_path}/site.npz with 60 rows"
        monkeypatch.setattr(
            secure_site, "site_vector", lambda *a, **k: (_ for _ in ()).throw(RuntimeError(message))
        )
    grid, run_config = secure_setup(tmp_path, *federation, node=node, **config)
    if callable(change):
        change(grid, tmp_path)
    with pytest.raises(FederationError) as err:
        run(grid, run_config)
    errors = grid.errors()
    category = case.split(" (")[0]
    assert errors and {text for _, text in errors} == {category}
    assert {s for s, _ in errors} == {stage}
    for _, text in errors:  # no count, size, value or path
        assert not re.search(r"[0-9/]", text)
    if stage == "query":
        assert f"failed: {category}" in str(err.value)
    logged = [r.getMessage() for r in caplog.records if "secure mode" in r.getMessage()]
    assert logged and all(m.startswith(f"distrank: secure mode, {category}: ") for m in logged)
    assert any(re.search(r"[0-9]", m) for m in logged)  # the site's own log has the detail
    assert not (tmp_path / "scores.csv").exists()


def test_the_category_of_each_exception():
    from distrank._checks import TooFewRows

    cases = {
        TooFewRows("client has 3 rows"): "too few rows",
        secure.OutOfBounds("n"): "out of bounds",
        secure_site.Refused("n"): "refused",
        ValueError("n"): "bad input",
        OSError("n"): "bad input",
        KeyError("n"): "bad input",
        RuntimeError("n"): "internal",
        ZeroDivisionError(): "internal",
    }
    assert {type(e).__name__: secure_site.category(e) for e in cases} == {
        type(e).__name__: c for e, c in cases.items()
    }
    assert set(cases.values()) == set(secure_site.CATEGORIES)


# -- a server that does not follow the protocol -----------------------------------------------


def test_a_site_refuses_a_server_that_uses_another_mask_generator(
    tmp_path, federation, server_process
):
    def stock_plan(stage, msg):
        if stage == "query":
            msg.content.config_records["secure"]["generator"] = "flower-1.42-fold32"

    with pytest.raises(FederationError) as err:
        run_secure(tmp_path, *federation, tamper=stock_plan)
    assert str(err.value) == "; ".join(f"site {s!r} failed: refused" for s in federation[0])


def test_a_site_refuses_both_shares_of_one_site(tmp_path, federation, server_process):
    """The server names paris both active and dropped at unmasking, which would hand it
    paris's private-seed shares and its key shares: every site refuses, no share leaves."""

    def both(stage, msg):
        if stage == Stage.UNMASK:
            configs = msg.content.config_records[RECORD_KEY_CONFIGS]
            configs[Key.DEAD_NODE_ID_LIST] = [101]

    grid, run_config = secure_setup(tmp_path, *federation, tamper=both)
    with pytest.raises(FederationError, match=r"halted at the 'unmask' stage"):
        run(grid, run_config)
    assert grid.errors() == [(Stage.UNMASK, "refused")] * 3


def test_a_site_refuses_a_threshold_below_a_majority(tmp_path, federation, server_process):
    def low(stage, msg):
        if stage == Stage.SETUP:
            msg.content.config_records[RECORD_KEY_CONFIGS][Key.THRESHOLD] = 1

    grid, run_config = secure_setup(tmp_path, *federation, tamper=low)
    with pytest.raises(FederationError, match=r"halted at the 'share keys' stage"):
        run(grid, run_config)
    assert grid.errors() == [(Stage.SHARE_KEYS, "refused")] * 3


def test_sites_refuse_to_unmask_a_sum_over_fewer_than_min_sites(
    tmp_path, federation, server_process
):
    """paris drops after the key exchange; oslo and rome (min-sites 3) will not unmask a
    sum of their two vectors."""
    grid, run_config = secure_setup(
        tmp_path, *federation, silent={101: Stage.COLLECT_MASKED_VECTORS}
    )
    with pytest.raises(FederationError, match=r"halted at the 'unmask' stage"):
        run(grid, run_config)
    assert grid.errors() == [(Stage.UNMASK, "refused")] * 2


def test_the_unmask_checks():
    secure_site.check_unmask([1, 2, 3], [4], 3)
    with pytest.raises(secure_site.Refused, match=r"names sites \[2\] as both active and dropped"):
        secure_site.check_unmask([1, 2, 3], [2], 3)
    with pytest.raises(secure_site.Refused, match="or one twice"):
        secure_site.check_unmask([1, 2, 2], [], 2)
    with pytest.raises(secure_site.Refused, match="cover 2 sites, fewer than this site's 'min-si"):
        secure_site.check_unmask([1, 2], [3], 3)
    secure_site.check_sites(3, 2, 3)
    with pytest.raises(secure_site.Refused, match="threshold 2 is no majority of the 4 sites"):
        secure_site.check_sites(4, 2, 3)


# -- noise --------------------------------------------------------------------------------


NOISY = {"metrics": "kd", "kernel": "rbf", "kernel-params": "bandwidth=3"}


def site_noise(plan, models, options, **policy):
    """(the plan with room for it, the std each site adds) under a site policy of
    epsilon 1, delta 1e-5, rows public, with ``policy``'s changes."""
    from dataclasses import replace

    from distrank.flower.policy import Policy

    site = Policy(
        feature_bound=BOUND, max_rows=1000, epsilon=1.0, delta=1e-5, rows="public", **policy
    )
    roomy = replace(plan, room=(("kd", 1e9),))
    stds, _, _ = secure_site.check_plan(site, roomy, models, options, np.zeros(plan.dim))
    return replace(plan, room=tuple(stds.items())), stds


def test_the_released_kd_avg_carries_the_calibrated_noise(federation):
    """Through the sites' noise, quantisation, Flower's sum and the server's table: the
    released KD_avg's variance over many runs is (A / t) sigma^2 / n^2, within its 99.9%
    sampling interval, and its mean is the exact KD_avg. sigma is the Gaussian mechanism
    of (1, 1e-5) for the sum's L2 sensitivity 4 sqrt(M) (M = 2 models, rbf)."""
    sites, models = federation
    options = RBF_KD
    plan = secure.Plan(tuple(models), ("kd",), 6, "size", BOUND, 1000, 1.0, threshold=2)
    plan, stds = site_noise(plan, models, options)
    exact = [secure_site.site_vector(x, models, options, plan, None) for x in sites.values()]
    rng, draws = np.random.default_rng(2024), 1500
    released = np.empty((draws, 2))
    summed = {b: std * math.sqrt(3) for b, std in stds.items()}  # 3 sites' noise
    for i in range(draws):
        mean = flower_sum([secure_site.add_noise(v, plan, stds, rng) for v in exact], plan)
        table, _ = secure_table(mean, 3, plan, models, None, noise=summed)
        released[i] = table.value.to_numpy()
    n = sum(len(x) for x in sites.values())
    expected = score(
        np.concatenate(list(sites.values())),
        np.repeat(list(sites), [len(x) for x in sites.values()]),
        models,
        metrics=["kd"],
        kernel="rbf",
        kernel_params={"bandwidth": 3.0},
        dtype="float64",
    ).query("aggregation == 'avg'")
    sigma = get_sigma_gaussian(1.0, 1e-5) * 4 * math.sqrt(2)  # dp_accounting, independently
    variance = (3 / 2) * (sigma / n) ** 2
    assert variance == pytest.approx(3 * stds["kd"] ** 2 / n**2, rel=1e-6)
    low, high = stats.chi2.ppf([0.0005, 0.9995], draws - 1) / (draws - 1)
    for g in range(2):
        ratio = released[:, g].var(ddof=1) / variance
        assert low <= ratio <= high, (ratio, low, high)
        z = (released[:, g].mean() - expected.value.iloc[g]) / np.sqrt(variance / draws)
        assert abs(z) < 3.5


def test_colluders_raise_each_honest_sites_share(federation):
    """A server that counts c members of its own among the t that unmask: each honest
    site of a policy with ``colluders`` c adds sigma^2 / (t - c), so the t - c honest
    sites alone carry sigma^2; a threshold that leaves no honest site is refused."""
    sites, models = federation
    options = RBF_KD
    plan = secure.Plan(tuple(models), ("kd",), 6, "size", BOUND, 1000, 1.0, threshold=3)
    sigma = get_sigma_gaussian(1.0, 1e-5) * 4 * math.sqrt(2)
    for c in (0, 1, 2):
        _, stds = site_noise(plan, models, options, colluders=c)
        assert (3 - c) * stds["kd"] ** 2 == pytest.approx(sigma**2, rel=1e-6)
    with pytest.raises(secure_site.Refused, match="leaves no honest site"):
        site_noise(plan, models, options, colluders=3)


def test_a_noisy_secure_run_reports_what_the_sites_attested(
    tmp_path, federation, reference, server_process
):
    """A run config that asks for epsilon 1 claims nothing by itself: with sites whose
    policy adds no noise, the sums are exact and the meta and ``noise_std`` say "no
    noise"; with sites of epsilon 1, the meta reports each site's attested noise and the
    table's noise std follows from it."""
    asked = NOISY | {"noise-epsilon": 1.0, "noise-delta": 1e-5}
    (tmp_path / "none").mkdir()
    (tmp_path / "noisy").mkdir()
    _, out = run_secure(tmp_path / "none", *federation, **asked)
    meta = json.loads(meta_path(out).read_text())
    assert meta["privacy"]["requested"] == {"epsilon": 1.0, "delta": 1e-5}
    assert meta["privacy"]["noise"] == "none"
    assert set(meta["privacy"]["sites"].values()) == {"no noise"}
    assert (pd.read_csv(bounds_path(out)).noise_std == 0).all()

    node = {"noise-epsilon": 1.0, "noise-delta": 1e-5, "rows": "public"}
    _, out = run_secure(tmp_path / "noisy", *federation, node=node, **asked)
    meta = json.loads(meta_path(out).read_text())
    attested = meta["secure"]["attested"]
    kd_std = math.sqrt(sum(a["noise"]["kd"] ** 2 for a in attested.values()))
    assert meta["privacy"]["noise"] == pytest.approx({"kd": kd_std})
    table = pd.read_csv(out, keep_default_na=False).merge(
        pd.read_csv(bounds_path(out)), on=["model", "metric", "aggregation"]
    )
    plain = score(
        *reference,
        federation[1],
        metrics=["kd"],
        kernel="rbf",
        kernel_params={"bandwidth": 3.0},
        dtype="float64",
    )
    merged = table.merge(
        plain, on=["model", "metric", "aggregation", "client"], suffixes=("", "_plain")
    )
    assert len(merged) == 2
    assert np.allclose(merged.noise_std, kd_std / len(reference[0]), rtol=1e-12)
    gap = (merged.value - merged.value_plain).abs()
    assert (gap > 100 * merged.bound).all() and (gap < 6 * merged.noise_std).all()
