"""Secure mode's values: the table against ``distrank score`` within its written bounds,
with sites dropping out, and the plan, quantisation and bounds that make them exact
(the attacks on it: ``test_flower_secure_attacks.py``)."""

from __future__ import annotations

import json
import logging
import math
import re
import time
from fractions import Fraction

import flwr
import numpy as np
import pandas as pd
import pytest
from flwr.common.secure_aggregation.ndarrays_arithmetic import (
    factor_combine,
    parameters_addition,
    parameters_mod,
)
from flwr.common.secure_aggregation.quantization import quantize
from flwr.common.secure_aggregation.secaggplus_constants import Stage
from secure_run import BOUND, flower_sum, run_secure

from distrank.flower.federation import RUN_CONFIG, FederationError, RunSettings
from distrank.flower.identity import verify_attestation
from distrank.flower.masks import GENERATOR
from distrank.flower.secure import plan as secure
from distrank.flower.secure.server import bounds_path
from distrank.metrics import score
from distrank.metrics._privacy import noise_multiplier
from distrank.metrics._registry import METRICS
from distrank.metrics._table import meta_path
from distrank.metrics.fd._frechet import GaussianStats, fd_bound, frechet_distance, gaussian_stats

KEY = ["model", "metric", "aggregation", "client"]


def within_bounds(out, reference, models) -> pd.DataFrame:
    """The secure table merged with ``distrank score`` and the bounds, each value checked
    to lie within its bound of the plain one."""
    table = pd.read_csv(out, keep_default_na=False)
    expected = score(*reference, models, metrics=["kd", "fd", "recall"], dtype="float64")
    merged = table.merge(expected, on=KEY, suffixes=("", "_score")).merge(
        pd.read_csv(bounds_path(out)), on=["model", "metric", "aggregation"]
    )
    assert len(merged) == len(table) == 3 * len(models) and (table.client == "").all()
    assert set(zip(merged.metric, merged.aggregation)) == {
        ("kd", "avg"),
        ("recall", "avg"),
        ("fd", "all"),
    }
    assert ((merged.value - merged.value_score).abs() <= merged.bound).all(), merged
    assert (merged.noise_std == 0).all()
    return merged


def test_the_secure_table_equals_score_within_its_bounds(
    tmp_path, federation, reference, server_process
):
    page = tmp_path / "report.html"
    _, out = run_secure(tmp_path, *federation, report=str(page))
    assert "Scores per model: all and avg" in re.findall(r"<h2[^>]*>(.*?)</h2>", page.read_text())
    merged = within_bounds(out, reference, federation[1])
    kd = merged[merged.metric == "kd"]
    assert (kd.bound < 1e-9 * kd.value_score.abs()).all()  # a bound that means something
    for metric in ("kd", "fd", "recall"):
        ours, theirs = (
            merged[merged.metric == metric].sort_values(col).model.tolist()
            for col in ("value", "value_score")
        )
        assert ours == theirs
    meta = json.loads(meta_path(out).read_text())
    attested = meta["secure"].pop("attested")
    assert meta["secure"] == {
        "sites": ["oslo", "paris", "rome"],
        "dropped": [],
        "threshold": 2,
        "generator": GENERATOR,
        "feature-bound": BOUND,
        "max-rows": 1000,
    }
    for site, said in attested.items():  # no noise, and said so, signed
        assert said["noise"] == {} and said["noise-epsilon"] == 0.0 and said["path"] == "secure"
        assert verify_attestation(said, tmp_path / "peers.json") == site
    assert meta["privacy"] == {
        "requested": "none",
        "noise": "none",
        "sites": dict.fromkeys(["oslo", "paris", "rome"], "no noise"),
    }
    assert meta["options"]["metrics"] == ["kd", "fd", "recall"]


def test_a_site_dropping_after_key_sharing(tmp_path, federation, reference, server_process, caplog):
    dropped = {101: Stage.COLLECT_MASKED_VECTORS}  # paris: keys shared, no vector
    node = {"min-sites": 2}
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, out = run_secure(
            tmp_path, *federation, node=node, silent=dropped, **{"secure-threshold": 2}
        )
    assert "site(s) ['paris'] dropped out: the sum is over ['oslo', 'rome']" in caplog.text
    keep = reference[1] != "paris"
    within_bounds(out, (reference[0][keep], reference[1][keep]), federation[1])
    secure_meta = json.loads(meta_path(out).read_text())["secure"]
    assert (secure_meta["sites"], secure_meta["dropped"]) == (["oslo", "rome"], ["paris"])
    out.unlink()
    with pytest.raises(FederationError) as err:
        run_secure(tmp_path, *federation, node=node, silent=dropped, **{"secure-threshold": 3})
    assert "halted at the 'collect masked vectors' stage: site(s) ['paris'] dropped out" in str(
        err.value
    )
    assert "unmasking needs 3 of the 3 sites (run config 'secure-threshold')" in str(err.value)
    assert not out.exists()


def test_ten_sites_two_dropping_at_two_stages(tmp_path, federation, server_process):
    """One site drops before it sends its vector, one while the server unmasks: the sum
    covers exactly the nine whose masked vectors arrived, and equals plain mode on them."""
    rng = np.random.default_rng(10)
    sites = {f"s{i}": rng.normal(size=(40 + 7 * i, 6)) + 0.3 * i for i in range(10)}
    silent = {102: Stage.COLLECT_MASKED_VECTORS, 106: Stage.UNMASK}  # s2, s6
    start = time.perf_counter()
    _, out = run_secure(tmp_path, sites, federation[1], silent=silent)
    wall = time.perf_counter() - start
    kept = [s for s in sites if s != "s2"]
    x = np.concatenate([sites[s] for s in kept])
    labels = np.repeat(kept, [len(sites[s]) for s in kept])
    within_bounds(out, (x, labels), federation[1])
    secure_meta = json.loads(meta_path(out).read_text())["secure"]
    assert (secure_meta["sites"], secure_meta["dropped"]) == (kept, ["s2"])
    assert secure_meta["threshold"] == 6
    print(f"ten sites, two dropping: {wall:.1f} s")


def test_bounds_below_a_sites_own_are_refused_before_its_data(
    tmp_path, federation, reference, server_process
):
    """A plan tighter than a site's own policy bounds is refused by every site alike,
    whatever its data; a site whose data break its own bounds is clipped inside its
    release (its rows scaled to its feature-bound), never refused."""
    sites, models = federation
    sharp = {"sharp": models["sharp"]}  # rows of norm <= 4.2; paris has 6.2
    for config in ({"feature-bound": 5.0}, {"max-rows": 70}):
        with pytest.raises(FederationError) as err:
            run_secure(tmp_path, sites, sharp, **config)
        assert str(err.value) == "; ".join(f"site {s!r} failed: refused" for s in sites)
    _, out = run_secure(tmp_path, sites, sharp, node={"feature-bound": 5.0}, metrics="kd")
    x = reference[0] * np.minimum(1.0, 5.0 / np.linalg.norm(reference[0], axis=1))[:, None]
    assert np.linalg.norm(sites["paris"], axis=1).max() > 5.0  # paris was clipped
    clipped = score(x, reference[1], sharp, metrics=["kd"], dtype="float64")
    table = pd.read_csv(out).merge(
        pd.read_csv(bounds_path(out)), on=["model", "metric", "aggregation"]
    )
    want = clipped.query("aggregation == 'avg'").value.item()
    assert abs(table.value.item() - want) <= table.bound.item()
    with pytest.raises(ValueError, match=r"models\['broad'\]: a row's L2 norm exceeds the run "):
        run_secure(tmp_path, *federation, **{"feature-bound": 7.0})
    with pytest.raises(FederationError, match=r"site\(s\) \['oslo', 'paris', 'rome'\] do not"):
        run_secure(tmp_path, *federation, node={"share-stats": False})


def plan_of(**changes) -> secure.Plan:
    base = dict(
        models=("a", "b"),
        metrics=("kd", "recall", "fd"),
        dim=3,
        weights="size",
        feature_bound=2.0,
        max_rows=500,
        kernel_bound=secure.kernel_bound("poly", {}, 3, 2.0),
    )
    return secure.Plan(**(base | changes))


def test_the_sum_is_off_by_at_most_k_s_2_pow_minus_60(federation):
    rng = np.random.default_rng(7)
    plan = plan_of()
    scales = secure.entry_scales(plan)
    for k in (2, 3, 17):
        vectors = [rng.uniform(-1, 1, scales.shape) * scales for _ in range(k)]
        vectors[0][:4] = scales[:4]  # the ends of the range
        vectors[1][:4] = -scales[:4]
        got = secure.decode(flower_sum(vectors, plan), k, plan)
        for i in range(len(scales)):
            exact = sum(Fraction(float(v[i])) for v in vectors)
            quant = k * Fraction(float(scales[i])) * Fraction(secure.GRID_ERROR)
            assert abs(Fraction(float(got[i])) - exact) <= quant + abs(exact) * Fraction(1, 2**53)
        (z,) = quantize([secure.encode(vectors[0], plan)], 1.0, secure.LEVELS)
        assert z.min() >= 0 and z.max() <= secure.LEVELS  # Flower's quantiser: exact integers
        assert np.array_equal(z, np.rint((secure.encode(vectors[0], plan) + 1) * 2**29))


def test_encode_refuses_values_outside_the_range_naming_the_setting():
    plan = plan_of()
    scales = secure.entry_scales(plan)
    v = scales / 2
    v[0] = 600.0  # n_i: the range is [-512, 512] (the power of two above max-rows 500)
    with pytest.raises(ValueError, match=r"block 'rows' is outside .* raise 'max-rows'"):
        secure.encode(v, plan)
    v[0], v[4] = 1.0, np.nan  # a recall entry
    with pytest.raises(ValueError, match=r"block 'recall' .* raise 'feature-bound' or 'max-rows'"):
        secure.encode(v, plan)


def test_the_clipping_ranges_come_from_the_public_settings():
    plan = plan_of()
    k_max = (4 / 3 + 1) ** 3  # poly defaults: gamma 1/d, coef0 1, degree 3; |x| <= 2
    assert plan.kernel_bound == pytest.approx(k_max)
    assert secure.kernel_bound("rbf", {"bandwidth": 3.0}, 3, 2.0) == 1.0
    assert secure.kernel_bound("linear", {}, 3, 2.0) == 4.0
    assert plan.scales() == {
        "rows": 512.0,
        "kd": 2.0 ** math.frexp(4 * k_max * 500 * (1 + 2**-10))[1],
        "recall": 512.0,
        "sum": 2048.0,  # 2 F N = 2000
        "scatter": 8192.0,  # 4 F^2 N = 8000
    }
    assert [b[1] for b in plan.blocks()] == [1, 2, 2, 3, 6] and plan.length() == 14
    uniform = plan_of(weights="uniform").scales()
    assert uniform["recall"] == 2.0 and uniform["sum"] == 2048.0
    u = np.array([[2.0, 0.0, 0.0]])  # |KD| <= 4 K is tight: X = {u}, Y = {-u}, biased KD
    kd = score(
        np.repeat(u, 5, 0),
        np.zeros(5, int),
        {"m": -u},
        metrics=["kd"],
        kernel="linear",
        kd_estimator="biased",
        dtype="float64",
    )
    assert kd.value.iloc[0] == 4 * secure.kernel_bound("linear", {}, 3, 2.0) == 16.0


@pytest.mark.parametrize("n,d", [(300, 6), (12, 20)])  # full rank; rank 11 of 20
def test_the_fd_bound_holds_under_the_worst_perturbations(n, d):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 2, d) + 0.5
    y = gaussian_stats(rng.normal(size=(400, d)))
    s1, s2 = x.sum(axis=0), x.T @ x
    exact = GaussianStats(n, s1 / n, (s2 - np.outer(s1, s1) / n) / (n - 1))
    for e in (1e-9, 1e-6, 1e-3):
        e1, e2 = e, e * 10
        bound = fd_bound(exact, y, s1, e1, e2)
        worst = 0.0
        for _ in range(20):
            d1 = e1 * rng.choice([-1.0, 1.0], d)
            d2 = e2 * rng.choice([-1.0, 1.0], (d, d))
            d2 = np.triu(d2) + np.triu(d2, 1).T  # S2 is summed as its upper triangle
            t1, t2 = s1 + d1, s2 + d2
            moved = GaussianStats(n, t1 / n, (t2 - np.outer(t1, t1) / n) / (n - 1))
            worst = max(worst, abs(frechet_distance(moved, y) - frechet_distance(exact, y)))
        assert 0 < worst <= bound


def test_secure_settings_and_what_they_refuse():
    base = RUN_CONFIG | secure.SECURE_CONFIG
    base |= {"models": "a=/a.npz", "sites": "x,y,z", "out": "/o.csv", "metrics": "kd,fd,recall"}
    base |= {"secure": True, "feature-bound": 10}

    def settings(**change):
        config = base | change
        return secure.SecureSettings.from_run_config(config, RunSettings.from_run_config(config))

    assert settings(secure=False) is None
    assert settings() == secure.SecureSettings(10.0, 1000000, 2)  # a majority of 3
    assert settings(**{"secure-threshold": 3}).threshold == 3
    with pytest.raises(ValueError) as err:
        settings(metrics="kd,precision,recall,density")
    assert str(err.value).startswith(
        "run config: metrics ['precision', 'density'] are refused in secure mode: it writes "
        "only what a secure sum of the sites' values gives (Metric.secure); Precision: "
    )
    assert str(err.value).endswith("Density: " + METRICS["density"].why_not)
    for change, match in [
        ({"feature-bound": 0.0}, "secure mode needs 'feature-bound' > 0"),
        ({"feature-bound": float("inf")}, "secure mode needs 'feature-bound' > 0"),
        ({"max-rows": 1}, "'max-rows' must be at least 2"),
        (
            {"secure-threshold": 4},
            r"'secure-threshold' must be 0 \(a majority\) or 2..3, a .* got 4$",
        ),
        (
            {"secure-threshold": 1},
            r"'secure-threshold' must be 0 \(a majority\) or 2..3, a .* got 1$",
        ),
        ({"sites": "a,b,c,d", "secure-threshold": 2}, r"or 3..4, a majority .* got 2"),
        ({"secure": "yes"}, "'secure' must be bool"),
        ({"max-rows": 10.0}, "'max-rows' must be int"),
        ({"sites": "x"}, r"secure mode sums 2..1023 'sites' .*, got 1"),
        ({"sites": ",".join(map(str, range(1024)))}, r"sums 2..1023 'sites' .*, got 1024"),
        ({"noise-epsilon": 1.0}, r"'noise-epsilon' needs 'noise-delta' in \(0, 1\), got 0.0"),
        ({"noise-epsilon": -1.0}, r"'noise-epsilon' must be a number >= 0, got -1.0"),
    ]:
        with pytest.raises(ValueError, match=match):
            settings(**change)


def test_the_noise_keys_and_what_they_need():
    """The noise room of a plan: the std a site with the run's (epsilon, delta) adds when it
    counts on no other site (c = t - 1), one row at least, n_i noised: blocks kd (4 per
    model under rbf, 2 models) and rows (1), the budget split over the two blocks."""
    base = RUN_CONFIG | secure.SECURE_CONFIG
    base |= {"models": "a=/a.npz,b=/b.npz", "sites": "x,y,z,w", "out": "/o.csv", "metrics": "kd"}
    base |= {"secure": True, "feature-bound": 10, "kernel": "rbf"}
    base |= {"kernel-params": "bandwidth=2", "noise-epsilon": 2.0, "noise-delta": 1e-6}
    models = {"a": np.zeros((5, 3)), "b": np.ones((5, 3))}

    def plan(**change):
        config = base | change
        settings = RunSettings.from_run_config(config)
        secured = secure.SecureSettings.from_run_config(config, settings)
        return secure.make_plan(settings, secured, models)

    z = noise_multiplier(epsilon=2.0, delta=1e-6) * math.sqrt(2)
    assert dict(plan().room) == pytest.approx({"kd": z * 4 * math.sqrt(2), "rows": z})
    assert dict(plan(weights="uniform").room) == dict(plan().room)  # min-rows 1 on the server
    assert plan(**{"noise-epsilon": 0.0}).room == ()
    poly = dict(plan(kernel="poly", **{"kernel-params": ""}).room)  # bounded on the ball
    low, high = (1 - 100 / 3) ** 3, (1 + 100 / 3) ** 3  # (<x, y> / 3 + 1)^3, |<x, y>| <= 100
    assert poly["kd"] == pytest.approx(z * 4 * (high - low) * math.sqrt(2))
    for change, match in [
        ({"kernel-params": ""}, r"kernel 'rbf' needs a 'bandwidth'"),
        ({"kd-estimator": "subsets"}, r"'noise-epsilon' 2: blocks \['kd'\] have no bounded"),
        ({"metrics": "kd,fd"}, r"'noise-epsilon' 2: blocks \['sum', 'scatter'\] have no bounded"),
    ]:
        with pytest.raises(ValueError, match=match):
            plan(**change)


def test_the_modulus_2_pow_40_is_exact_in_the_pinned_flowers_int64_arithmetic():
    """Flower documents moduli below 2^32; 1.42's SecAgg+ arithmetic is int64, so 2^40 is
    exact: 1023 sites' largest limbs and weight factors, masked by the largest masks."""
    assert flwr.__version__ == "1.42.0"  # the pin this relies on (pyproject.toml)
    k, top = secure.MAX_SITES, secure.MODULUS - 1
    assert k * secure.LEVELS < secure.MODULUS <= (k + 1) * secure.LEVELS
    limbs = [np.full(4, secure.LEVELS, np.int64)]  # the largest quantised limb, 2^30
    one = factor_combine(secure.LEVELS, limbs)  # with Flower's weight factor 2^30
    masked = parameters_mod(
        parameters_addition(one, [np.full(1, top), np.full(4, top)]), secure.MODULUS
    )
    total = masked
    for _ in range(k - 1):
        total = parameters_mod(parameters_addition(total, masked), secure.MODULUS)
    unmasked = [(t - k * top) % secure.MODULUS for t in total]
    assert all(a.dtype == np.int64 for a in total)
    assert unmasked[0][0] == k * secure.LEVELS and (unmasked[1] == k * secure.LEVELS).all()


def test_decoding_refuses_a_non_finite_aggregate():
    plan = plan_of()
    mean = np.zeros(2 * plan.length())
    mean[3] = np.nan
    with pytest.raises(ValueError, match="the aggregate holds non-finite values"):
        secure.decode(mean, 3, plan)
