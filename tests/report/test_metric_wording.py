"""What the page says of a metric comes from its registered ``Metric`` (``agrees``,
``consistent``, ``provided``, ``pooled_from``, ``spreads``), never from its key: a plugin
metric declared SAFE reads as KD does, an unregistered one gets the generic wording, and
the client-only avg is ``distrank.clients.average`` with weights n_i/n. Every assertion
reads the parsed page (its tables and the items of its sections), not a substring."""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
from textkit import html_tables

from distrank.clients import average, client_weights
from distrank.metrics._metric import SAFE, Metric, Rows
from distrank.metrics._registry import register, unregister
from distrank.report.client_sections import client_average
from distrank.report.html import build_report

KEY = "meangap"
METRIC = Metric(
    KEY,
    "MeanGap",
    False,
    None,  # no family: the page never scores
    lambda options: Rows(1, 1, "a mean"),
    agrees=SAFE,
    consistent="avg = all + sum_i lambda_i |m_i - m|^2, a model-free offset",
    breaks={"weights": {"uniform": "the pooled mean is sum_i (n_i/n) m_i"}},
    provided="the clients used weights n_i/n",
    pooled_from="the clients' (n_i, mean)",
    spreads=("meangap_std",),
)
COLUMNS = ["model", "metric", "aggregation", "client", "value"]
SIZES = {"a": 30, "b": 10}


@pytest.fixture
def registered():
    register(METRIC)
    try:
        yield METRIC
    finally:
        unregister(KEY)


class _Items(HTMLParser):
    """The visible text of each ``<li data-metric>`` in the section ``<section id=key>``."""

    def __init__(self, key: str):
        super().__init__(convert_charrefs=True)
        self.key, self.section, self.metric = key, None, None
        self.items: dict[str, list[str]] = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section = attrs.get("id")
        elif tag == "li" and self.section == self.key and "data-metric" in attrs:
            self.metric = attrs["data-metric"]
            self.items[self.metric] = []

    def handle_endtag(self, tag):
        if tag == "li":
            self.metric = None
        elif tag == "section":
            self.section = None

    def handle_data(self, data):
        if self.metric is not None:
            self.items[self.metric].append(data)


def items(page: str, section: str) -> dict[str, str]:
    """Metric key -> the text of its item in ``section`` (whitespace collapsed)."""
    parser = _Items(section)
    parser.feed(page)
    parser.close()
    return {k: " ".join("".join(v).split()) for k, v in parser.items.items()}


def verdict_rows(page: str) -> dict[str, dict[str, str]]:
    """Metric name -> its row of the verdicts table, by column header."""
    head, *rows = next(t for t in html_tables(page) if t[0][0] == "metric")
    return {row[0]: dict(zip(head, row)) for row in rows}


def pooled_table() -> pd.DataFrame:
    rows = []
    for model, base in (("A", 1.0), ("B", 2.0), ("C", 0.5)):
        for metric, gap in ((KEY, 0.25), ("mystery", 0.25)):
            rows += [(model, metric, "all", "", base), (model, metric, "avg", "", base + gap)]
    return pd.DataFrame(rows, columns=COLUMNS)


def client_table() -> pd.DataFrame:
    """Two clients (n = 30 and 10) whose size-weighted and plain means order A and B
    oppositely, for the test metric, an unregistered one and the test metric's spread."""
    values = {"a": {"A": 0.2, "B": 0.5}, "b": {"A": 1.0, "B": 0.6}}
    rows = [
        (model, metric, "client", client, scale * v)
        for client, by_model in values.items()
        for model, v in by_model.items()
        for metric, scale in ((KEY, 1.0), ("mystery", 10.0), ("meangap_std", 100.0))
    ]
    return pd.DataFrame(rows, columns=COLUMNS)


def test_a_registered_safe_metric_gets_the_safe_wording(registered):
    page = build_report(pooled_table(), meta={"options": {"weights": "size"}})
    rows = verdict_rows(page)
    mine, other = rows["MeanGap"], rows["mystery"]
    assert mine["safe to average?"] == "safe" and other["safe to average?"] == "not guaranteed"
    assert mine["measured on these models"].split("\n") == [
        "gap MeanGap_avg - MeanGap_all: 0.2500 (mean)",
        "max - min: 0.000, constant",
        "0 flipped pairs",
    ]
    assert other["measured on these models"].split("\n") == [
        "gap avg - all: 0.2500 (mean)",
        "max - min: 0.000",
        "0 flipped pairs",
    ]


def test_a_registered_safe_metric_gets_the_safe_wording_without_pooled_data(registered):
    meta = {"reference": {c: {"n": n} for c, n in SIZES.items()}, "options": {"weights": "size"}}
    page = build_report(client_table(), meta=meta)
    said = items(page, "client-only")
    assert set(said) == {KEY, "mystery"}  # a spread is neither averaged nor ranked
    # size-weighted: A = 0.75*0.2 + 0.25*1.0 = 0.4 < B = 0.75*0.5 + 0.25*0.6 = 0.525
    assert said[KEY] == (
        "MeanGap: the centralized ranking is known without pooling the data: it is the avg "
        "ranking, A > B (avg = all + sum_i lambda_i |m_i - m|^2, a model-free offset), "
        "provided the clients used weights n_i/n. MeanGap_all itself is not known: it "
        "needs the clients' (n_i, mean)."
    )
    assert said["mystery"] == (
        "mystery: only the avg ranking (A > B) is known. The centralized ranking may "
        "differ, and the client scores cannot tell how. Even clients that agree do not "
        "fix the pooled order (Proposition 1)."
    )
    tables = html_tables(page)  # no verdicts table; one per metric of the clients, no spread
    assert [t[0] for t in tables] == [["model", "a", "b"]] * 2


def test_the_client_only_avg_is_the_clients_average_with_size_weights():
    table = client_table()
    clients = table[table["metric"] != "meangap_std"]
    avg = client_average(clients, SIZES)
    assert set(avg["aggregation"]) == {"avg"} and len(avg) == 4
    for row in avg.itertuples():
        part = clients[(clients["model"] == row.model) & (clients["metric"] == row.metric)]
        sizes = [SIZES[c] for c in part["client"]]
        expected = average(part["value"].to_numpy(float), client_weights(sizes, "size"))
        assert row.value == expected
    plain = client_average(clients, None)
    for row in plain.itertuples():
        part = clients[(clients["model"] == row.model) & (clients["metric"] == row.metric)]
        assert row.value == average(part["value"], client_weights(np.ones(len(part)), "uniform"))
    # the page ranks by that avg: A > B with n_i weights (4 < 5.25), B > A with 1/k (6 > 5.5)
    meta = {"reference": {c: {"n": n} for c, n in SIZES.items()}}
    for given, order in ((meta, "A > B"), ({}, "B > A")):
        said = items(build_report(clients, meta=given), "client-only")
        assert said["mystery"].startswith(f"mystery: only the avg ranking ({order}) is known.")
