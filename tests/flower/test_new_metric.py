"""A new metric, defined in this one file and registered once, is in every path: ``score``,
the CLI's ``--metric``, the score table, re-aggregation, bootstrap intervals, the report's
verdicts and Flower's plain and secure modes -- each value against its closed form.

The metric: the squared distance between feature means, ``|mean(X) - mean(Y)|^2``. With
lambda_i = n_i / n the pooled mean is sum_i lambda_i m_i, so
``avg = all + sum_i lambda_i |m_i - m|^2``: a model-free offset, like KD's (it is KD with
the linear kernel, biased). It has a plain path only (re-aggregation and the bootstrap
score it afresh), its ``all`` in plain Flower from the sites' shared means
(``Metric.pooled``), and a secure sum of its own: the weighted sum of the sites' values
for ``avg`` and the sum of their rows for ``all``. A second metric, KD with the run's
kernel computed densely, shows that a plugin that declares ``uses_kernel`` gets the
kernel in every path and a kernel bound in secure mode; it owns an option,
``kernelgap_estimator`` (biased or unbiased), declared in its ``Metric`` alone, which
``distrank score`` takes as ``--kernelgap-estimator``, a config as a ``metrics:`` key,
plain and secure Flower as the run-config key ``kernelgap-estimator`` (each site scores
with it) and the report records. A config that lists the module registering it under
``plugins:`` selects it in the pipeline: the plugin's module and that line are all it
takes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from secure_run import run_secure
from textkit import html_tables

from distrank.cli import main as cli
from distrank.flower.federation import RUN_CONFIG, RunSettings
from distrank.flower.messages import decode_reply, encode_request, option_keys
from distrank.flower.node import SiteConfig
from distrank.flower.policy import Policy
from distrank.flower.secure.server import bounds_path
from distrank.flower.server import federated_table
from distrank.flower.site import score_site
from distrank.metrics import (  # a plugin's whole vocabulary: the public face
    Family,
    Metric,
    Option,
    Pooled,
    Rows,
    Run,
    ScoreOptions,
    SecureSum,
    WeightedSum,
    bootstrap_scores,
    register,
    score,
    score_partitions,
    unregister,
)
from distrank.metrics._bootstrap import flat_summary
from distrank.metrics._metric import METRIC_KEYS, SAFE
from distrank.metrics._table import meta_path
from distrank.metrics.kd import kernel_distance
from distrank.report.html import build_report
from distrank.report.verdicts import consistency

KEY = "meangap"
REPO = Path(__file__).resolve().parents[2]


class MeanGap(Family):
    def plain(self, inputs, keys):
        x, groups = inputs.reference.double().numpy(), inputs.groups

        def compute():
            out = {}
            for name, y in inputs.models.items():
                m_y = y.double().numpy().mean(axis=0)
                local = [
                    ((x[groups.rows(c)].mean(axis=0) - m_y) ** 2).sum()
                    for c in range(len(groups.names))
                ]
                out[name] = {KEY: (float(((x.mean(axis=0) - m_y) ** 2).sum()), np.array(local))}
            return out

        return Run(compute)


class SharedMeans(Pooled):
    """all from the sites' means: the pooled mean is sum_i n_i m_i / n."""

    def site(self, x, device=None):
        return {"mean": np.asarray(x, np.float64).mean(axis=0)}

    def finish(self, sites, models, device=None):
        n = sum(size for size, _ in sites)
        mean = sum(size * s["mean"] for size, s in sites) / n
        return {g: gaps(mean[None], y) for g, y in models.items()}


class MeanGapSum(SecureSum):
    """avg: the weighted sum of the sites' values (|D| <= (2F)^2); all: the pooled mean
    from S1 = sum_rows (x - c) (|x - c| <= 2 F)."""

    needs_scores = True
    avg = WeightedSum(KEY, lambda plan: 4 * plan.feature_bound**2)

    def blocks(self, plan):
        return [
            *self.avg.blocks(plan),
            ("meangap-rows", plan.dim, 2 * plan.feature_bound * plan.max_rows),
        ]

    def site(self, plan, x, scores, centre, device=None):
        return [*self.avg.site(plan, x, scores, centre), len(x) * (x.mean(axis=0) - centre)]

    def finish(self, plan, sums, n, k, centre, models, errors, device=None):
        out = self.avg.finish(plan, sums, n, k, centre, models, errors)
        mean = centre + sums["meangap-rows"] / n
        shift = math.sqrt(plan.dim) * errors["meangap-rows"] / n  # |error of the pooled mean|
        gaps = [
            float(np.linalg.norm(mean - np.asarray(models[g]).mean(axis=0))) for g in plan.models
        ]
        out["all"] = (
            np.array([g * g for g in gaps]),
            np.array([2 * g * shift + shift**2 for g in gaps]),
        )
        return out


METRIC = Metric(
    KEY,
    "MeanGap",
    False,
    MeanGap(),
    lambda options: Rows(1, 1, "a mean"),
    agrees=SAFE,
    consistent="avg = all + sum_i lambda_i |m_i - m|^2, a model-free offset",
    breaks={"weights": {"uniform": "the pooled mean is sum_i (n_i/n) m_i"}},
    secure=MeanGapSum(),
    pooled=SharedMeans(),
)

KERNEL_KEY = "kernelgap"


class KernelGap(Family):
    """KD with the scorer's kernel (``inputs.kernel``), from dense kernel matrices: the
    V-statistic, or the U-statistic under ``kernelgap_estimator="unbiased"``."""

    uses_kernel = True

    def plain(self, inputs, keys):
        x, groups, k = inputs.reference.double(), inputs.groups, inputs.kernel
        unbiased = inputs.options.kernelgap_estimator == "unbiased"

        def within(a):
            n, kaa = len(a), k(a, a)
            return float((kaa.sum() - kaa.trace()) / (n * (n - 1))) if unbiased else kaa.mean()

        def kd(a, y):
            return float(within(a) + within(y) - 2 * k(a, y).mean())

        def compute():
            clients = [inputs.client_rows(c).double() for c in range(len(groups.names))]
            values = {}
            for name, y in inputs.models.items():
                y = y.double()
                values[name] = {KERNEL_KEY: (kd(x, y), np.array([kd(a, y) for a in clients]))}
            return values

        return Run(compute)


KERNEL_METRIC = Metric(
    KERNEL_KEY,
    "KernelGap",
    False,
    KernelGap(),
    lambda options: Rows(2, 2, "a kernel mean"),
    agrees=SAFE,
    consistent="KD (V- or U-statistic): Theorem 1",
    secure=WeightedSum(KERNEL_KEY, lambda plan: 4 * plan.kernel_bound),  # |KD| <= 4 max k
    options=(
        Option(
            "kernelgap_estimator",
            str,
            "biased",
            "KernelGap's estimator: the V-statistic (biased) or the U-statistic",
            choices=("biased", "unbiased"),
        ),
    ),
)


@pytest.fixture
def registered():
    register(METRIC)
    register(KERNEL_METRIC)
    yield METRIC
    unregister(KEY)
    unregister(KERNEL_KEY)


def gaps(x, y) -> float:
    return float(((np.mean(x, axis=0) - np.mean(y, axis=0)) ** 2).sum())


def closed_forms(sites: dict, models: dict) -> dict:
    """(model, aggregation, client) -> value, from the rows alone."""
    x = np.concatenate(list(sites.values()))
    n = len(x)
    out = {}
    for g, y in models.items():
        local = {s: gaps(rows, y) for s, rows in sites.items()}
        out[(g, "all", "")] = gaps(x, y)
        out[(g, "avg", "")] = sum(len(sites[s]) / n * v for s, v in local.items())
        out |= {(g, "client", s): v for s, v in local.items()}
    return out


def check(table: pd.DataFrame, expected: dict, rtol=1e-12) -> int:
    rows = table[table.metric == KEY]
    for r in rows.itertuples():
        assert r.value == pytest.approx(expected[(r.model, r.aggregation, r.client)], rel=rtol)
    return len(rows)


def test_score_the_table_and_the_report(registered, federation, reference):
    sites, models = federation
    table = score(*reference, models, metrics=[KEY, "kd"], dtype="float64")
    assert check(table, closed_forms(sites, models)) == 2 * (2 + 3)
    offsets = table[table.metric == KEY].pivot_table(
        index="model", columns="aggregation", values="value"
    )
    assert np.ptp((offsets["avg"] - offsets["all"]).to_numpy()) < 1e-12  # model-free
    verdicts = consistency(table, {"options": {"weights": "size"}}).set_index("metric")
    assert verdicts.loc[KEY, "verdict"] == SAFE == verdicts.loc["kd", "verdict"]
    assert verdicts.loc[KEY, "why"] == METRIC.consistent
    assert consistency(table, {"options": {"weights": "uniform"}}).set_index("metric").loc[
        KEY, "why"
    ] == ("the pooled mean is sum_i (n_i/n) m_i")
    # the page: its verdicts table (parsed cells) says what the Metric declares
    head, *rows = next(
        t
        for t in html_tables(build_report(table, meta={"options": {"weights": "size"}}))
        if t[0][0] == "metric"
    )
    row = next(dict(zip(head, r)) for r in rows if r[0] == "MeanGap")
    assert row["safe to average?"] == SAFE and row["why"] == METRIC.consistent
    measured = row["measured on these models"].split("\n")
    assert measured[1].endswith(", constant") and measured[2] == "0 flipped pairs"


def test_the_cli(registered, federation, reference, tmp_path):
    sites, models = federation
    np.savez(tmp_path / "ref.npz", features=reference[0], clients=reference[1])
    args = [
        "score",
        "--reference",
        str(tmp_path / "ref.npz"),
        "--metric",
        KEY,
        "--dtype",
        "float64",
    ]
    for g, y in models.items():
        np.savez(tmp_path / f"{g}.npz", features=y)
        args += ["--model", f"{g}={tmp_path / g}.npz"]
    assert cli([*args, "--out", str(tmp_path / "scores.csv")]) == 0
    table = pd.read_csv(tmp_path / "scores.csv", keep_default_na=False, dtype={"client": str})
    assert check(table, closed_forms(sites, models), rtol=1e-6) == 2 * (2 + 3)  # float32 features


def test_reaggregation_and_bootstrap_score_it_afresh(registered, federation, reference):
    sites, models = federation
    x, labels = reference
    halves = np.where(np.arange(len(x)) % 2 == 0, "even", "odd")
    table = score_partitions(x, {"sites": labels, "halves": halves}, models, metrics=[KEY])
    split = {s: x[halves == s] for s in ("even", "odd")}
    assert check(table[table.partition == "halves"], closed_forms(split, models)) == 2 * 4
    assert check(table[table.partition == "sites"], closed_forms(sites, models)) == 2 * 5
    # The bootstrap mean of all* is |x - y|^2 + sum_i n_i v_i / n^2 + v_y / m (v: mean
    # squared distance to the mean; rows resampled within each client and each model).
    result = bootstrap_scores(
        x, labels, models, ScoreOptions(metrics=(KEY,)), summary=flat_summary, n_resamples=400
    )
    assert np.array_equal(result.point.values[0, :, 0], [gaps(x, y) for y in models.values()])
    n = len(x)
    for g, y in enumerate(models.values()):
        spread = sum(len(r) * ((r - r.mean(0)) ** 2).sum(1).mean() for r in sites.values()) / n**2
        expected = gaps(x, y) + spread + ((y - y.mean(0)) ** 2).sum(1).mean() / len(y)
        draws = result.distribution[g * 5]  # (metric 0, model g, aggregation all)
        assert abs(draws.mean() - expected) < 4 * draws.std() / math.sqrt(len(draws))


def test_flower_plain_and_secure(registered, federation, reference, tmp_path, server_process):
    sites, models = federation
    expected = closed_forms(sites, models)
    options = ScoreOptions(metrics=(KEY,), dtype="float64", kernel_params={}).as_dict()
    request = encode_request(models, {k: v for k, v in options.items() if k in option_keys()})
    replies = []
    for name, rows in sites.items():
        np.savez(tmp_path / f"{name}-site.npz", features=rows)
        policy = Policy(share_stats=True, plain=("scores",))
        site = SiteConfig(name, tmp_path / f"{name}-site.npz", policy)
        replies.append(decode_reply(score_site(site, request)))
    table = federated_table(replies, models=models)
    assert check(table, expected) == 2 * (2 + 3)  # all (from the shared means), avg, 3 sites
    assert sorted(table[table.aggregation == "all"].model) == sorted(models)
    _, out = run_secure(tmp_path, sites, models, metrics=KEY)
    table = pd.read_csv(out, keep_default_na=False).merge(pd.read_csv(bounds_path(out)))
    assert sorted(zip(table.model, table.aggregation)) == [
        (g, a) for g in sorted(models) for a in ("all", "avg")
    ]
    for r in table.itertuples():
        assert abs(r.value - expected[(r.model, r.aggregation, "")]) <= r.bound
    assert json.loads(meta_path(out).read_text())["secure"]["sites"] == sorted(sites)


def test_a_plugin_that_uses_the_kernel(registered, federation, reference, tmp_path, server_process):
    """The kernel reaches the plugin (biased KD of every client and the pool equal to
    ``kernel_distance``), and secure mode bounds it by the run's kernel: every value within
    its bound of the plain value (a kernel bound of 0 would quantise every entry to 0)."""
    sites, models = federation
    rbf = {"kernel": "rbf", "kernel_params": {"bandwidth": 2.0}}
    table = score(*reference, models, metrics=[KERNEL_KEY], dtype="float64", **rbf)
    x = reference[0]
    for r in table[table.aggregation != "avg"].itertuples():
        rows = x if r.aggregation == "all" else sites[r.client]
        want = kernel_distance(rows, models[r.model], estimator="biased", dtype="float64", **rbf)
        assert r.value == pytest.approx(want, rel=1e-10)
    plain = table[table.aggregation == "avg"].set_index("model")["value"]
    secure, _ = secure_kernel_gaps(tmp_path, sites, models)
    for r in secure.itertuples():
        assert 0 < r.bound < 1e-3 and abs(r.value - plain[r.model]) <= r.bound


def secure_kernel_gaps(tmp_path, sites: dict, models: dict, **config) -> tuple[pd.DataFrame, Path]:
    """A secure run of KernelGap under the rbf kernel of bandwidth 2 (and ``config``): its
    rows (every one an ``avg``) with their bounds, and its table's path."""
    _, out = run_secure(
        tmp_path,
        sites,
        models,
        metrics=KERNEL_KEY,
        kernel="rbf",
        **{"kernel-params": "bandwidth=2"},
        **config,
    )
    secure = pd.read_csv(out, keep_default_na=False).merge(pd.read_csv(bounds_path(out)))
    assert list(secure.aggregation) == ["avg"] * len(models)
    return secure, out


def kernel_gaps(sites: dict, models: dict, estimator: str) -> dict:
    """(model, aggregation, client) -> KernelGap under the rbf kernel of bandwidth 2."""
    x, n = np.concatenate(list(sites.values())), sum(len(r) for r in sites.values())
    rbf = {"kernel": "rbf", "kernel_params": {"bandwidth": 2.0}, "dtype": "float64"}
    out = {}
    for g, y in models.items():
        local = {s: kernel_distance(r, y, estimator=estimator, **rbf) for s, r in sites.items()}
        out[(g, "all", "")] = kernel_distance(x, y, estimator=estimator, **rbf)
        out[(g, "avg", "")] = sum(len(sites[s]) / n * v for s, v in local.items())
        out |= {(g, "client", s): v for s, v in local.items()}
    return out


def test_its_own_option_reaches_every_path(
    registered, federation, reference, tmp_path, server_process
):
    """``kernelgap_estimator``, declared in the plugin's Metric alone: a flag of the CLI,
    recorded in its metadata and on the report page, a key of a run config that the
    sites score with in plain and secure Flower; every value the U-statistic's."""
    sites, models = federation
    expected = kernel_gaps(sites, models, "unbiased")
    assert expected != kernel_gaps(sites, models, "biased")
    x, labels = reference
    np.savez(tmp_path / "ref.npz", features=x, clients=labels)
    args = ["score", "--reference", str(tmp_path / "ref.npz"), "--metric", KERNEL_KEY]
    args += ["--kernel", "rbf", "--kernel-param", "bandwidth=2", "--dtype", "float64"]
    for g, y in models.items():
        np.savez(tmp_path / f"{g}.npz", features=y)
        args += ["--model", f"{g}={tmp_path / g}.npz"]
    out = tmp_path / "scores.csv"
    assert cli([*args, "--kernelgap-estimator", "unbiased", "--out", str(out)]) == 0
    table = pd.read_csv(out, keep_default_na=False, dtype={"client": str})
    for r in table.itertuples():  # float32 features
        assert r.value == pytest.approx(expected[(r.model, r.aggregation, r.client)], rel=1e-5)
    meta = json.loads(meta_path(out).read_text())
    assert meta["options"]["kernelgap_estimator"] == "unbiased"
    assert "kernelgap_estimator=unbiased" in build_report(table, meta=meta)
    # plain Flower: the run config's key, carried by the request, scored with at every site
    run = RunSettings.from_run_config(
        RUN_CONFIG
        | {"models": "a=/a.npz", "sites": ",".join(sites), "out": "/o.csv", "dtype": "float64"}
        | {"metrics": KERNEL_KEY, "kernel": "rbf", "kernel-params": "bandwidth=2"}
        | {"kernelgap-estimator": "unbiased"}
    )
    assert run.options["kernelgap_estimator"] == "unbiased"
    request = encode_request(models, run.options)
    replies = []
    for name, rows in sites.items():
        np.savez(tmp_path / f"{name}-site.npz", features=rows)
        site = SiteConfig(name, tmp_path / f"{name}-site.npz", Policy(plain=("scores",)))
        replies.append(decode_reply(score_site(site, request)))
    table = federated_table(replies, models=models)
    assert set(table.aggregation) == {"avg", "client"}
    for r in table.itertuples():
        assert r.value == pytest.approx(expected[(r.model, r.aggregation, r.client)], rel=1e-10)
    # secure Flower: the sites' U-statistics summed, every avg within its bound
    secure, out = secure_kernel_gaps(tmp_path, sites, models, **{"kernelgap-estimator": "unbiased"})
    for r in secure.itertuples():
        assert abs(r.value - expected[(r.model, "avg", "")]) <= r.bound < 1e-3
    assert json.loads(meta_path(out).read_text())["options"]["kernelgap_estimator"] == "unbiased"
    bad = {"models": "a=/a.npz", "sites": "x", "out": "/o.csv", "kernelgap-estimator": "jackknife"}
    with pytest.raises(ValueError, match="kernelgap_estimator: expected one of"):
        RunSettings.from_run_config(RUN_CONFIG | bad)


def test_a_config_selects_it(registered, tmp_path, monkeypatch):
    """The pipeline's schema takes any metric name; the config check knows the registered
    ones, and a module under ``plugins:`` registers its own before the check."""
    from snakemake.utils import validate

    from distrank.config import check, load_plugins

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["metrics"]["metrics"] = [*METRIC_KEYS, KEY]  # the default study, and this metric
    config["metrics"]["kernelgap_estimator"] = "unbiased"  # a plugin's own option
    validate(config, str(REPO / "workflow/schemas/config.schema.yaml"))
    check(config)  # registered by the fixture
    for key, value, match in (
        ("kernelgap_estimator", "jackknife", "kernelgap_estimator: expected one of"),
        (
            "kernelgap_estimater",
            "unbiased",
            r"unknown scoring option\(s\) \['kernelgap_estimater'\]",
        ),
    ):
        wrong = {**config, "metrics": {**config["metrics"], key: value}}
        validate(wrong, str(REPO / "workflow/schemas/config.schema.yaml"))  # any key, typed
        with pytest.raises(ValueError, match=r"^config: metrics: .*" + match):
            check(wrong)
    config["metrics"]["metrics"] = [*METRIC_KEYS, "nogap"]
    with pytest.raises(ValueError, match=r"^config: metrics.metrics: 'nogap' is not a registered"):
        check(config)
    (tmp_path / "nogap_plugin.py").write_text(
        "from dataclasses import replace\n"
        "from distrank.metrics import register\n"
        "from test_new_metric import METRIC\n"
        "register(replace(METRIC, key='nogap'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config["plugins"] = ["nogap_plugin"]
    try:
        load_plugins(config)
        check(config)
    finally:
        unregister("nogap")
    config["plugins"] = ["no_such_plugin"]
    with pytest.raises(ValueError, match=r"^config: plugins: cannot import 'no_such_plugin'"):
        load_plugins(config)
