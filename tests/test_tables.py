"""write_table: three formats, exact CSV, escaped LaTeX, deterministic bytes."""

import numpy as np
import pandas as pd
import pytest
from textkit import markdown_tables

from distrank.tables import latex_escape, write_table


@pytest.fixture
def table():
    return pd.DataFrame(
        {
            "model": ["cgan_trunc0.5", "noise 10%", "vae&co"],
            "KD_all": [1 / 3, 2.5e-7, np.nan],
            "KD_all_rank": np.array([2, 1, 3], dtype=np.int64),
        }
    )


def test_writes_three_files_with_identical_bytes_twice(table, tmp_path):
    first = write_table(table, tmp_path / "E1_kd_gap", caption="KD gap")
    data = {k: p.read_bytes() for k, p in first.items()}
    second = write_table(table.copy(), tmp_path / "E1_kd_gap", caption="KD gap")
    assert sorted(first) == ["csv", "md", "tex"]
    assert {k: p.name for k, p in second.items()} == {
        k: f"E1_kd_gap.{k}" for k in ("csv", "md", "tex")
    }
    assert {k: p.read_bytes() for k, p in second.items()} == data
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "E1_kd_gap.csv",
        "E1_kd_gap.md",
        "E1_kd_gap.tex",
    ]


def test_csv_round_trips_floats_exactly(table, tmp_path):
    paths = write_table(table, tmp_path / "sub" / "t.v1")
    back = pd.read_csv(paths["csv"], keep_default_na=True)
    assert paths["csv"].name == "t.v1.csv"
    assert back["KD_all"].iloc[0] == 1 / 3 and back["KD_all"].iloc[1] == 2.5e-7
    pd.testing.assert_frame_equal(back, table)


def test_markdown_and_latex_content(table, tmp_path):
    paths = write_table(table, tmp_path / "E1", caption="Gap & ranks_1", float_format=".3g")
    md = paths["md"].read_text()
    assert md.startswith("Table: Gap & ranks_1\n\n| model")
    assert markdown_tables(md) == [
        [
            {"model": "cgan_trunc0.5", "KD_all": "0.333", "KD_all_rank": "2"},
            {"model": "noise 10%", "KD_all": "2.5e-07", "KD_all_rank": "1"},
            {"model": "vae&co", "KD_all": "", "KD_all_rank": "3"},
        ]
    ]
    tex = paths["tex"].read_text()
    lines = tex.splitlines()
    assert lines[:4] == [
        r"\begin{table}[t]",
        r"\centering",
        r"\caption{Gap \& ranks\_1}",
        r"\label{tab:E1}",
    ]
    assert r"\begin{tabular}{lrr}" in lines and lines.count(r"\toprule") == 1
    assert r"model & KD\_all & KD\_all\_rank \\" in lines
    assert r"cgan\_trunc0.5 & 0.333 & 2 \\" in lines
    assert r"noise 10\% & 2.5e-07 & 1 \\" in lines
    assert r"vae\&co &  & 3 \\" in lines
    assert lines[-3:] == [r"\bottomrule", r"\end{tabular}", r"\end{table}"]


def test_no_caption_gives_bare_tabular(table, tmp_path):
    tex = write_table(table, tmp_path / "x")["tex"].read_text()
    assert tex.startswith(r"\begin{tabular}") and r"\caption" not in tex
    assert write_table(table, tmp_path / "x")["md"].read_text().startswith("| model")


def test_latex_escape_all_specials():
    assert latex_escape(r"a_b&c%d$e#f{g}h~i^j\k") == (
        r"a\_b\&c\%d\$e\#f\{g\}h\textasciitilde{}i\textasciicircum{}j\textbackslash{}k"
    )


def test_rejects_non_dataframe(tmp_path):
    with pytest.raises(TypeError, match=r"^df must be a pandas DataFrame, got list$"):
        write_table([[1, 2]], tmp_path / "x")
