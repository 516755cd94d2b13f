"""The consistency report page (distrank.report.html): its numbers and its HTML."""

from __future__ import annotations

import base64
import io
import re

import pandas as pd
from PIL import Image
from textkit import html_tables, shows_rounded, significant, visible_lines, visible_text, words

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
    shown = values_shown(page)
    pooled = table[table.aggregation.isin(["all", "avg"])]
    assert len(shown) == len(pooled)
    for row in pooled.itertuples():
        assert shows_rounded(shown[row.model, row.aggregation, row.metric], row.value)
    decimals = re.findall(r"\d*\.\d+(?:e[-+]\d+)?", visible_text(page))  # all the others
    assert len(decimals) > len(shown) and {significant(d)[1] for d in decimals} == {4}
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


def values_shown(page: str) -> dict[tuple[str, str, str], str]:
    """The number in each cell of the page's score table, by (model, aggregation, metric
    key): the table has an all row and an avg row per model, one column per metric."""
    head, *rows = html_tables(page)[0]
    keys = {"KID": "kd", "FID": "fd", "KD": "kd", "FD": "fd"}
    metrics = [keys.get(h.split()[0], h.split()[0].lower()) for h in head[2:]]
    assert head[:2] == ["model", ""] and len(rows) % 2 == 0
    shown = {}
    for (model, *all_cells), avg_cells in zip(rows[::2], rows[1::2]):
        for agg, cells in zip(("all", "avg"), (all_cells, avg_cells)):
            assert cells[0] == agg and len(cells) == len(metrics) + 1
            for metric, cell in zip(metrics, cells[1:]):
                number, rank = cell.split()
                assert re.fullmatch(r"\(\d+\)", rank), cell
                shown[model, agg, metric] = number
    return shown


def measured(page: str) -> dict[str, list[str]]:
    """The lines of the "measured on these models" cell of each metric's verdict row."""
    head, *rows = next(t for t in html_tables(page) if t[0][0] == "metric")
    column = head.index("measured on these models")
    return {row[0]: row[column].split("\n") for row in rows}


def test_a_difference_at_rounding_level_reads_as_rounding(tidy):
    # Recall: all = 0.3, avg = 0.1 + 0.2 (one float64 rounding apart); KD: a gap of 0.2
    # whose range over the models is rounding only; FD: a real difference of 1e-9, the
    # same for both models.
    table = tidy(
        {
            "kd": {"A": (0.1, 0.1 + 0.2), "B": (0.7, 0.7 + 0.2)},
            "fd": {"A": (2.0, 2.0 + 1e-9), "B": (3.0, 3.0 + 1e-9)},
            "recall": {"A": (0.3, 0.1 + 0.2), "B": (0.5, 0.5)},
        }
    )
    kd_gaps = [(0.1 + 0.2) - 0.1, (0.7 + 0.2) - 0.7]
    assert 0 < abs(kd_gaps[0] - kd_gaps[1]) < 1e-15 and 0 < (0.1 + 0.2) - 0.3 < 1e-15
    # shown as rounding: within 2^12 ulp of values below 1, 4096 * 2^-52 < 1e-12
    cells = measured(build_report(table, meta={"options": {"weights": "size"}}))
    assert cells["KD"] == [
        "gap KD_avg - KD_all: 0.2000 (mean)",
        "max - min: < 1e-12 (float rounding), constant",
        "0 flipped pairs",
    ]
    assert cells["Recall"] == ["max |avg - all|: < 1e-12 (float rounding)", "0 flipped pairs"]
    gap, spread, flips = cells["FD"]
    number = re.fullmatch(r"gap avg - all: (\S+) \(mean\)", gap)
    assert number and flips == "0 flipped pairs"
    assert shows_rounded(number[1], 1e-9)  # a real difference is a number, however small
    assert (2.0 + 1e-9) - 2.0 == (3.0 + 1e-9) - 3.0 and spread == "max - min: 0.000"  # exact


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
        "KD: the centralized ranking is known without pooling the data: it is the avg "
        "ranking, A > B (Theorem 1: KD_avg = KD_all + sum_i lambda_i KD(P_bar, P_i), a "
        "model-free offset), provided the clients used weights n_i/n, one kernel"
    )
    assert kd.endswith(
        " KD_all itself is not known: it needs kernel sums across clients (its offset)."
    )
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
