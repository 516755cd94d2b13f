"""A metric owns its average (``Metric.average``): a metric registered with another average
than the weighted mean gets it in every ``avg`` the package makes -- ``score``, the
pipeline's averaged record and its table, plain Flower's table and the report's
client-only ``avg`` -- and no code averages outside the table builder and the metrics'
own batched paths."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from distrank._io import write_json
from distrank.clients import client_weights
from distrank.metrics import score
from distrank.metrics._family import Family, Run, SecureSum, WeightedSum
from distrank.metrics._metric import Metric, Rows
from distrank.metrics._registry import register, unregister
from distrank.metrics._score_files import average_client_files, collect
from distrank.report.client_sections import client_average

KEY = "gapmax"
SRC = Path(__file__).resolve().parents[2] / "src/distrank"
RNG = np.random.default_rng(50)


def largest(local, weights):
    """The worst client's value (not a weighted mean): clients on the last axis."""
    out = np.max(np.asarray(local, np.float64), axis=-1)
    return float(out) if out.ndim == 0 else out


class Gap(Family):
    """|mean(X) - mean(Y)|^2, pooled and per client."""

    def plain(self, inputs, keys):
        x, groups = inputs.reference.double().numpy(), inputs.groups

        def gap(rows, y):
            return float(((rows.mean(axis=0) - y.mean(axis=0)) ** 2).sum())

        def compute():
            out = {}
            for name, y in inputs.models.items():
                y = y.double().numpy()
                local = np.array([gap(x[groups.rows(c)], y) for c in range(len(groups.names))])
                out[name] = {KEY: (gap(x, y), local)}
            return out

        return Run(compute)


METRIC = Metric(KEY, "GapMax", False, Gap(), lambda o: Rows(1, 1, "a mean"), average=largest)


@pytest.fixture
def registered():
    register(METRIC)
    yield METRIC
    unregister(KEY)


@pytest.fixture(scope="module")
def data():
    x, labels = RNG.normal(size=(90, 4)), np.repeat(["a", "b", "c"], [20, 30, 40])
    models = {"g": RNG.normal(0.3, size=(40, 4)), "h": RNG.normal(size=(50, 4))}
    return x, labels, models


def test_score_averages_by_the_metric(registered, data):
    table = score(*data, metrics=[KEY, "kd"], dtype="float64")
    rows = table.set_index(["metric", "model", "aggregation", "client"]).value
    for g in data[2]:
        local = [rows[KEY, g, "client", c] for c in "abc"]
        assert rows[KEY, g, "avg", ""] == max(local)
        kd = [rows["kd", g, "client", c] for c in "abc"]  # the others: the weighted mean
        assert rows["kd", g, "avg", ""] == pytest.approx(np.dot(kd, [2 / 9, 3 / 9, 4 / 9]))


def test_the_pipeline_record_and_its_table(registered, data, tmp_path):
    x, labels, models = data
    table = score(x, labels, models, metrics=[KEY], dtype="float64")
    rows = table.set_index(["model", "aggregation", "client"]).value
    paths = []
    for c in "abc":
        scores = {g: {KEY: rows[g, "client", c]} for g in models}
        record = {"client": c, "n": int((labels == c).sum()), "models": {}}
        record["models"] = {g: {"m": len(y), "scores": scores[g]} for g, y in models.items()}
        write_json(tmp_path / f"{c}.json", record)
        paths.append(tmp_path / f"{c}.json")
    avg = average_client_files(paths, tmp_path / "avg.json", weights="size")
    assert {g: v["scores"][KEY] for g, v in avg["models"].items()} == {
        g: rows[g, "avg", ""] for g in models
    }
    write_json(
        tmp_path / "all.json",
        {"n": 90, "models": {g: {"m": 1, "scores": {KEY: rows[g, "all", ""]}} for g in models}},
    )
    collected = collect(tmp_path / "avg.json", tmp_path / "all.json", list(models))
    assert collected.equals(table)


def test_plain_flower_and_the_report(registered, data):
    x, labels, models = data
    table = score(x, labels, models, metrics=[KEY], dtype="float64")
    clients = table[table.aggregation == "client"]
    sizes = {"a": 20, "b": 30, "c": 40}
    avg = client_average(clients, sizes).set_index("model").value
    assert avg.to_dict() == table[table.aggregation == "avg"].set_index("model").value.to_dict()
    pytest.importorskip("flwr")
    from distrank.flower.messages import SiteReply
    from distrank.flower.server import federated_table

    replies = [
        SiteReply(c, sizes[c], {g: {KEY: v} for g, v in part.set_index("model").value.items()})
        for c, part in clients.groupby("client")
    ]
    federated = federated_table(replies)
    assert federated.equals(table[table.aggregation != "all"].reset_index(drop=True))


def test_a_secure_weighted_sum_is_the_weighted_mean_only():
    assert client_weights([1, 3], "size") @ np.array([2.0, 6.0]) == 5.0
    with pytest.raises(ValueError, match="its secure sum adds the sites' weighted values"):
        Metric(
            KEY, "GapMax", False, Gap(), METRIC.needs, average=largest, secure=WeightedSum(KEY, abs)
        )

    class OwnSum(SecureSum):
        own_average = True

    assert Metric(KEY, "GapMax", False, Gap(), METRIC.needs, average=largest, secure=OwnSum())


# The modules allowed to average: the table builder, and the metrics' own batched paths
# (KD's bootstrap re-weighting, FD's terms, E9's noisy KD), each through its Metric.
AVERAGING = {
    "metrics/_table.py",
    "metrics/kd/_family.py",
    "metrics/fd/_settings.py",
    "experiments/e9_private_ranking.py",
}


def test_no_module_averages_outside_the_builder_and_the_metrics():
    found = {}
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        where = str(path.relative_to(SRC))
        if re.search(
            r"from distrank\.clients import[^\n]*\baverage\b|(?<![.\w`])clients\.average\b(?!`)",
            text,
        ):
            found.setdefault(where, []).append("clients.average")
        if re.search(r"\b(METRICS\[[^\]]+\]|[A-Z_]*METRIC)\.average\(|\b_average\(", text):
            found.setdefault(where, []).append("Metric.average")
    assert found.pop("metrics/_metric.py") == ["clients.average"]  # the default, named once
    assert set(found) == AVERAGING, found
