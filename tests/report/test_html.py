"""The consistency report page (distrank.report.html): its numbers and its HTML."""

from __future__ import annotations

import base64
import io
import re

import pandas as pd
from PIL import Image
from textkit import visible_lines, visible_text, words

from distrank.figures import metric_label
from distrank.report.html import build_report, write_report


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


def test_names_are_escaped_and_write_is_atomic(tmp_path, tidy):
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
