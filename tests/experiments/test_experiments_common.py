"""Helpers the experiments share, from distrank.metrics._table and .ranking: wide tables,
ranks, rank agreement; and distrank.experiments.named_on."""

import itertools

import numpy as np
import pandas as pd
import pytest
from experiments_testkit import tidy
from scipy import stats

from distrank.metrics._ranking import discordant_pairs, rank_models
from distrank.metrics._table import rank_agreement, wide


def _scores(fd_all, fd_avg):
    rows = []
    for i, (a, v) in enumerate(zip(fd_all, fd_avg)):
        rows += [
            (f"m{i}", "fd", "all", "", a),
            (f"m{i}", "fd", "avg", "", v),
            (f"m{i}", "fd", "client", "0", v),
        ]
    return tidy(rows)


def test_wide_one_row_per_model():
    table = wide(_scores([3.0, 1.0], [4.0, 2.5]), ["fd"])
    assert table.columns.tolist() == ["model", "FD_all", "FD_avg"]
    assert table.to_dict("list") == {
        "model": ["m0", "m1"],
        "FD_all": [3.0, 1.0],
        "FD_avg": [4.0, 2.5],
    }


def test_wide_rejects_missing_and_duplicates():
    scores = _scores([1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"^scores has no rows for metric\(s\) \['kd'\]"):
        wide(scores, ["kd"])
    with pytest.raises(ValueError, match=r"^models \['m1'\] lack an all or avg score$"):
        wide(scores[~((scores.model == "m1") & (scores.aggregation == "avg"))], ["fd"])
    with pytest.raises(ValueError, match=r"^duplicate score rows: "):
        wide(pd.concat([scores, scores.iloc[:1]]), ["fd"])
    with pytest.raises(ValueError, match=r"^scores lacks columns \['client'\]"):
        wide(scores.drop(columns="client"), ["fd"])


def test_rank_models_matches_scipy_rankdata():
    values = np.array([0.3, 0.1, 0.3, 0.7, 0.2])
    np.testing.assert_array_equal(
        rank_models(values, higher_is_better=False), stats.rankdata(values, method="min")
    )
    np.testing.assert_array_equal(
        rank_models(values, higher_is_better=True), stats.rankdata(-values, method="min")
    )


def test_discordant_pairs_and_tau_agree_with_scipy():
    rng = np.random.default_rng(3)
    a, b = rng.random(9), rng.random(9)
    brute = [
        (i, j) for i, j in itertools.combinations(range(9), 2) if (a[i] - a[j]) * (b[i] - b[j]) < 0
    ]
    assert discordant_pairs(a, b) == brute
    table = rank_agreement(pd.DataFrame({"FD_all": a, "FD_avg": b}), ["fd"])
    n_pairs = 9 * 8 / 2
    # Without ties, tau = (concordant - discordant) / pairs.
    assert table.loc[0, "kendall_tau"] == pytest.approx(1 - 2 * len(brute) / n_pairs, abs=1e-12)
    assert table.loc[0, "kendall_tau"] == pytest.approx(stats.kendalltau(b, a).statistic, abs=1e-12)
    assert table.loc[0, "rank_flips"] == len(brute)


def test_rank_agreement_single_model_is_nan():
    table = rank_agreement(pd.DataFrame({"KD_all": [1.0], "KD_avg": [2.0]}), ["kd"])
    assert np.isnan(table.loc[0, "kendall_tau"]) and table.loc[0, "n_models"] == 1


def test_tables_name_fd_and_kd_fid_and_kid_on_inception_only():
    from distrank.experiments import named_on

    table = pd.DataFrame(
        {
            "model": ["a", "b"],
            "metric": ["FD", "kd"],
            "FD_all": [1.0, 2.0],
            "KD_gap": [0.1, 0.1],
            "FDX": [0, 0],  # another name that starts alike
            "Precision_all": [0.5, 0.6],
        }
    )
    on = named_on(table, "inception")
    assert on.columns.tolist() == ["model", "metric", "FID_all", "KID_gap", "FDX", "Precision_all"]
    assert on["metric"].tolist() == ["FID", "KID"]
    assert on["FID_all"].tolist() == [1.0, 2.0] and table.columns[2] == "FD_all"
    assert named_on(table, "efficientnet_lite0") is table and named_on(table, None) is table
