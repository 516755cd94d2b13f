"""The consistency report page (distrank.report.html): its numbers and its HTML."""

from __future__ import annotations

import base64
import io
import re

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from textkit import visible_lines, visible_text, words

from distrank.figures import metric_label
from distrank.report.html import build_report, consistency, flipped_pairs, write_report

RNG = np.random.default_rng(11)


def poly(a, b):
    """KID's kernel, (a.b / d + 1)^3, in float64 (the scorer's default kernel)."""
    return (a @ b.T / a.shape[1] + 1.0) ** 3


@pytest.fixture(scope="module")
def scored():
    """Scores of four models on three heterogeneous clients, by the package's scorer."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from distrank.metrics import score

    clients = np.repeat(["a", "b", "c"], [30, 45, 25])
    x = RNG.normal(size=(100, 3)) + (clients == "b")[:, None] * 1.5 - (clients == "c")[:, None]
    models = {
        "wide": RNG.normal(0, 1.6, (40, 3)),
        "narrow": RNG.normal(0, 0.4, (40, 3)),
        "shifted": RNG.normal(0.8, 1.0, (40, 3)),
        "close": RNG.normal(0.1, 1.1, (40, 3)),
    }
    tables = {
        w: score(x, clients, models, kd_estimator="biased", weights=w, dtype="float64")
        for w in ("size", "uniform")
    }
    return x, clients, tables


def test_kd_gap_is_theorem_1s_constant_and_recall_is_exact(scored):
    x, clients, tables = scored
    result = consistency(tables["size"], {"options": {"weights": "size", "kd_estimator": "biased"}})
    kd, recall = (result.set_index("metric").loc[m] for m in ("kd", "recall"))
    # Theorem 1 (V-statistic, lambda_i = n_i/n): KD_avg - KD_all = sum_i lambda_i KD(P_bar, P_i)
    # = sum_i lambda_i mean k(X_i, X_i) - mean k(X, X), whatever the model.
    lam = {c: np.mean(clients == c) for c in np.unique(clients)}
    offset = (
        sum(lam[c] * poly(x[clients == c], x[clients == c]).mean() for c in lam) - poly(x, x).mean()
    )
    assert kd.verdict == "safe" and kd.gap_mean == pytest.approx(offset, rel=1e-10)
    assert kd.gap_range < 1e-10 * offset and kd.rank_flips == 0 and kd.kendall_tau == 1.0
    assert recall.verdict == "exact" and recall.max_absdiff < 1e-12
    assert kd.why.startswith("Theorem 1: KD_avg = KD_all + ")
    assert recall.why.startswith("exact: Recall_all = sum_i (n_i / n) Recall_i")
    assert set(result.loc[~result.metric.isin(["kd", "recall"]), "verdict"]) == {"not guaranteed"}


def test_uniform_weights_and_subsets_are_not_safe_for_kd(scored):
    _, _, tables = scored
    uniform = consistency(tables["uniform"], {"options": {"weights": "uniform"}})
    kd = uniform.set_index("metric").loc["kd"]
    assert kd.verdict == "not guaranteed"
    assert kd.why.startswith("Theorem 1 needs weights n_i/n; with uniform weights ")
    assert kd.gap_range > 1e-3 * abs(kd.gap_mean)  # the gap now depends on the model
    subsets = consistency(
        tables["size"], {"options": {"weights": "size", "kd_estimator": "subsets"}}
    )
    assert subsets.set_index("metric").loc["kd", "verdict"] == "not guaranteed"
    unknown = consistency(tables["size"]).set_index("metric").loc["kd"]
    assert unknown.verdict == "safe"
    assert unknown.why.endswith(" (options not recorded: assuming weights n_i/n)")


def tidy(values: dict[str, dict[str, tuple[float, float]]]) -> pd.DataFrame:
    """{metric: {model: (all, avg)}} -> a tidy table."""
    rows = [
        (model, metric, agg, "", v)
        for metric, by_model in values.items()
        for model, pair in by_model.items()
        for agg, v in zip(("all", "avg"), pair)
    ]
    return pd.DataFrame(rows, columns=["model", "metric", "aggregation", "client", "value"])


def test_flipped_pairs_follow_each_metrics_direction():
    table = tidy(
        {
            "fd": {"A": (1.0, 2.5), "B": (2.0, 2.0), "C": (3.0, 3.5)},
            "precision": {"A": (0.9, 0.5), "B": (0.8, 0.6), "C": (0.1, 0.2)},
        }
    )
    fd = flipped_pairs(table, "fd")  # lower is better: A beats B by all, B beats A by avg
    assert fd[["model_a", "model_b"]].values.tolist() == [["A", "B"]]
    assert fd.iloc[0][["a_all", "b_all", "a_avg", "b_avg"]].tolist() == [1.0, 2.0, 2.5, 2.0]
    precision = flipped_pairs(table, "precision")  # higher is better
    assert precision[["model_a", "model_b"]].values.tolist() == [["A", "B"]]
    result = consistency(table).set_index("metric")
    # one discordant pair of three: tau = (concordant - discordant) / pairs = (2 - 1) / 3
    assert result.loc["fd", "kendall_tau"] == pytest.approx(1 / 3)
    assert result.loc["fd", "rank_flips"] == 1


def test_page_is_self_contained_and_shows_every_number(scored):
    _, _, tables = scored
    table = tables["size"]
    page = build_report(
        table,
        meta={"options": {"weights": "size"}},
        extractor="inception",
        source="runs/scores.csv",
    )
    assert "<script" not in page and not re.search(r"""(src|href)=["']?(https?:|//)""", page)
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 2  # E1 and E6
    for data in images:
        with Image.open(io.BytesIO(base64.b64decode(data))) as img:
            assert img.format == "PNG" and img.size[0] > 500
    for row in table[table.aggregation.isin(["all", "avg"])].itertuples():
        cell = re.search(
            rf'data-model="{row.model}" data-metric="{row.metric}" '
            rf'data-aggregation="{row.aggregation}">([^ <]+)',
            page,
        )
        assert cell and cell[1] == f"{row.value:.6g}", (row.model, row.metric)
    lines = visible_lines(page)
    assert lines[0] == "Consistency report: scores.csv"
    assert lines[lines.index("metrics") + 1] == "KID, FID, Precision, Recall, Density, Coverage"
    assert named_distances(page) == {"KID", "KID_all", "KID_avg", "FID", "FID_all", "FID_avg"}
    assert (
        build_report(
            table,
            meta={"options": {"weights": "size"}},
            extractor="inception",
            source="runs/scores.csv",
        )
        == page
    )  # same input, same bytes


def named_distances(page: str) -> set[str]:
    """The words of the page's visible text that name FD, KD, FID or KID (KD_all ...)."""
    return {w for w in words(visible_text(page)) if re.fullmatch(r"(F|K)I?D(_\w+)?", w)}


def test_text_names_fd_and_kd_as_the_figures_do(scored):
    """On Inception features the text says FID/KID (as the axes do); elsewhere FD/KD."""
    table = scored[2]["size"]
    for extractor, fd, kd in (("inception", "FID", "KID"), ("dinov2_vits14", "FD", "KD")):
        page = build_report(table, meta={"options": {"weights": "size"}}, extractor=extractor)
        assert named_distances(page) == {kd, f"{kd}_all", f"{kd}_avg", fd, f"{fd}_all", f"{fd}_avg"}
        assert metric_label("kd", extractor, "all").startswith(kd + "$")
        lines = visible_lines(page)
        flips = lines[lines.index("Where avg and all disagree: model pairs that flip") + 1 :]
        assert flips[0] == f"{kd}: no pair flips; all and avg rank these models alike."
        assert flips[1].startswith(f"{fd}: ")


def test_names_are_escaped_and_write_is_atomic(tmp_path):
    table = tidy({"kd": {"<b>x</b>&": (1.0, 1.5), "y": (2.0, 2.5)}})
    path = write_report(table, tmp_path / "out" / "page.html")
    page = path.read_text()
    assert "&lt;b&gt;x&lt;/b&gt;&amp;" in page and "<b>x</b>&" not in page
    assert sorted(p.name for p in path.parent.iterdir()) == ["page.html"]
    assert "The E1 figure needs KD and FD in both aggregations." in visible_lines(page)


def test_client_rows_only_say_what_can_be_concluded():
    rows = []
    for client, values in (("a", {"A": 0.2, "B": 0.5}), ("b", {"A": 0.9, "B": 0.6})):
        for model, v in values.items():
            rows += [
                (model, "kd", "client", client, v),
                (model, "fd", "client", client, 10 * v),
                (model, "recall", "client", client, 1 - v),
            ]
    table = pd.DataFrame(rows, columns=["model", "metric", "aggregation", "client", "value"])
    meta = {"reference": {"a": {"n": 30}, "b": {"n": 10}}, "options": {"weights": "size"}}
    page = build_report(table, meta=meta)
    lines = visible_lines(page)
    heading = lines.index("What can and cannot be concluded without pooled data")
    assert lines[heading + 1].endswith(
        "avg computed here with weights n_i/n from the recorded client sizes."
    )
    # size-weighted avg: A = 0.75*0.2 + 0.25*0.9 = 0.375 < B = 0.75*0.5 + 0.25*0.6 = 0.525
    kd, fd, recall = lines[heading + 2 : heading + 5]
    assert kd.startswith(
        "KD: the centralized ranking is known without pooling the data: by Theorem 1 it "
        "is the avg ranking, A > B, provided"
    )
    assert " KD_all itself is not known: " in kd
    assert recall.startswith("Recall: ") and recall.endswith(
        "the pooled values are known and are the avg values: A > B."
    )
    assert fd.startswith(
        "FD: only the avg ranking (A > B) is known. The centralized ranking may differ: "
        "FD_all follows from the clients' (n_i, mean, covariance), not from their FD scores"
    )
    disagree = [line for line in lines if line.startswith("The clients disagree: ")]
    assert len(disagree) == 3 and "data:image" not in page  # one per metric; no figures
    plain = visible_lines(build_report(table))  # then: the plain mean
    assert plain[plain.index(lines[heading]) + 1].endswith(
        "avg computed here as the plain mean of the clients (client sizes not recorded: "
        "weights 1/k)."
    )
