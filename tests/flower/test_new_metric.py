"""A new metric, defined in this one file and registered once, is in every path: ``score``,
the CLI's ``--metric``, the score table, re-aggregation, bootstrap intervals, the report's
verdicts and Flower's plain and secure modes -- each value against its closed form.

The metric: the squared distance between feature means, ``|mean(X) - mean(Y)|^2``. With
lambda_i = n_i / n the pooled mean is sum_i lambda_i m_i, so
``avg = all + sum_i lambda_i |m_i - m|^2``: a model-free offset, like KD's (it is KD with
the linear kernel, biased). It has a plain path only (re-aggregation and the bootstrap
score it afresh) and a secure sum of its own: the weighted sum of the sites' values for
``avg`` and the sum of their rows for ``all``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from secure_run import run_secure

from distrank.cli import main as cli
from distrank.flower.messages import OPTION_KEYS, decode_reply, encode_request
from distrank.flower.node import SiteConfig
from distrank.flower.secure.server import bounds_path
from distrank.flower.server import federated_table
from distrank.flower.site import score_site
from distrank.metrics import score
from distrank.metrics.bootstrap import bootstrap_scores, flat_summary
from distrank.metrics.families import Family, Run, SecureSum, WeightedSum
from distrank.metrics.options import ScoreOptions
from distrank.metrics.reaggregate import score_partitions
from distrank.metrics.registry import SAFE, Metric, Rows, register, unregister
from distrank.metrics.table import meta_path
from distrank.report.verdicts import consistency

KEY = "meangap"


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
)


@pytest.fixture
def registered():
    register(METRIC)
    yield METRIC
    unregister(KEY)


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
    request = encode_request(models, {k: v for k, v in options.items() if k in OPTION_KEYS})
    replies = []
    for name, rows in sites.items():
        np.savez(tmp_path / f"{name}-site.npz", features=rows)
        replies.append(
            decode_reply(
                score_site(
                    SiteConfig(name, tmp_path / f"{name}-site.npz", secure_only=False), request
                )
            )
        )
    assert check(federated_table(replies, models=models), expected) == 2 * (1 + 3)
    _, out = run_secure(tmp_path, sites, models, metrics=KEY)
    table = pd.read_csv(out, keep_default_na=False).merge(pd.read_csv(bounds_path(out)))
    assert sorted(zip(table.model, table.aggregation)) == [
        (g, a) for g in sorted(models) for a in ("all", "avg")
    ]
    for r in table.itertuples():
        assert abs(r.value - expected[(r.model, r.aggregation, "")]) <= r.bound
    assert json.loads(meta_path(out).read_text())["secure"]["sites"] == sorted(sites)
