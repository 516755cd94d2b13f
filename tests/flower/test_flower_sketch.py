"""Sketch mode on Flower (``metrics = "kd_sketch"``): each site sends its sketch once, no
model goes down, and the server ranks models then and later from the sketches alone.
Plain: every site's sketch, kept as files; secure: the pooled sketch of a SecAgg+ sum,
with distributed noise whose variance an analyst checks over many runs (chi-square).
Values against ``distrank.metrics.score(metrics=["kd_sketch"])`` on the pooled rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from secure_run import BOUND, flower_sum, run, secure_setup

from distrank.flower.secure import plan as secure
from distrank.flower.secure import site as secure_site
from distrank.flower.secure.server import bounds_path, sketch_path
from distrank.flower.server import sketches_dir
from distrank.metrics import score
from distrank.metrics.sketch import _maps as sk
from distrank.metrics.sketch._confidence import score_sketches
from distrank.metrics.sketch._family import DIM, pooled_sketch

SKETCH = {"metrics": "kd_sketch", "kernel": "rbf", "kernel-params": "bandwidth=3", "seed": 4}
KEY = ["model", "metric", "aggregation", "client"]


def expected(reference, models):
    return score(
        *reference,
        models,
        metrics=["kd_sketch"],
        kernel="rbf",
        kernel_params={"bandwidth": 3.0},
        seed=4,
        dtype="float64",
    )


def no_model_goes_down(sent):
    def tamper(stage, msg):
        if stage == "query":
            sent.append(len(msg.content.array_records["models"]))

    return tamper


@pytest.mark.parametrize("mode", ["plain", "secure"])
def test_sites_send_sketches_and_the_server_ranks_from_them(
    mode, tmp_path, federation, reference, server_process
):
    sites, models = federation
    sent = []
    grid, config = secure_setup(
        tmp_path,
        sites,
        models,
        tamper=no_model_goes_down(sent),
        node={"plain": "" if mode == "secure" else "sketch"},
        **SKETCH,
        secure=mode == "secure",
    )
    out = run(grid, config)
    assert sent == [0] * 3  # the requests hold no model
    table = pd.read_csv(out, keep_default_na=False)
    merged = table.merge(expected(reference, models), on=KEY, suffixes=("", "_score"))
    assert len(merged) == len(table) == (2 * 5 if mode == "plain" else 2)
    if mode == "plain":
        np.testing.assert_allclose(merged.value, merged.value_score, rtol=1e-9)
        later = score_sketches(
            {s: sk.load(sketches_dir(out) / f"{s}.sketch.npz") for s in sorted(sites)},
            {"later": np.full((40, 6), 0.3)},
        )  # a model ranked without the sites
        assert set(later.aggregation) == {"all", "avg", "client"}
        return
    bounds = pd.read_csv(bounds_path(out))
    merged = merged.merge(bounds, on=["model", "metric", "aggregation"])
    assert ((merged.value - merged.value_score).abs() <= merged.bound).all()
    pooled = sk.load(sketch_path(out))
    assert pooled.n == sum(len(x) for x in sites.values()) and pooled.mean.shape == (DIM,)


def test_the_released_pooled_sketch_carries_the_calibrated_noise(federation):
    """The analyst's view over many runs: sites' noise, quantisation, Flower's sum and the
    server's decoding; each entry's variance is (A / t) sigma^2 / n^2 (chi-square), and
    its mean the exact pooled sketch."""
    from dataclasses import replace

    from dp_accounting import get_sigma_gaussian

    from distrank.flower.policy import Policy

    sites, _ = federation
    plan = secure.Plan(
        (), ("kd_sketch",), 6, "size", BOUND, 1000, 1.0, threshold=2, seed=4, bandwidth=3.0
    )
    options = {"metrics": ["kd_sketch"], "kernel": "rbf", "kernel_params": {"bandwidth": 3.0}}
    site = Policy(feature_bound=BOUND, max_rows=1000, epsilon=1.0, delta=1e-5, rows="public")
    stds, _, _ = secure_site.check_plan(
        site, replace(plan, room=(("sketch", 1e9),)), {}, options, np.zeros(6)
    )
    plan = replace(plan, room=tuple(stds.items()))
    exact = [secure_site.site_vector(x, {}, {}, plan, None) for x in sites.values()]
    n = sum(len(x) for x in sites.values())
    truth = sk.FeatureMap(6, DIM, 3.0, 4).sketch(np.concatenate(list(sites.values()))).mean
    rng, draws = np.random.default_rng(7), 120
    released = np.empty((draws, DIM))
    for i in range(draws):
        mean = flower_sum([secure_site.add_noise(v, plan, stds, rng) for v in exact], plan)
        released[i] = pooled_sketch(plan, secure.split(secure.decode(mean, 3, plan), plan), n).mean
    variance = (3 / 2) * (2 * get_sigma_gaussian(1.0, 1e-5) / n) ** 2  # sensitivity 2, t = 2
    assert variance == pytest.approx(3 * stds["sketch"] ** 2 / n**2, rel=1e-6)
    dof = released.size - DIM
    low, high = stats.chi2.ppf([0.0005, 0.9995], dof) / dof
    ratio = ((released - released.mean(axis=0)) ** 2).sum() / dof / variance
    assert low <= ratio <= high, (ratio, low, high)
    z = (released.mean(axis=0) - truth) / np.sqrt(variance / draws)
    assert np.abs(z).max() < 6  # 4096 entries: |z| < 6 for all at 1e-9 each
