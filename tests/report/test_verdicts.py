"""The report's verdicts (distrank.report.verdicts): may avg stand in for all?"""

from __future__ import annotations

import numpy as np
import pytest

from distrank.metrics._table import flipped_pairs
from distrank.report.verdicts import ROUNDING_ULPS, consistency, rounding_level


def poly(a, b):
    """KID's kernel, (a.b / d + 1)^3, in float64 (the scorer's default kernel)."""
    return (a @ b.T / a.shape[1] + 1.0) ** 3


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
    assert kd.gap_range < 1e-10 * offset and kd.gap_constant
    assert kd.rank_flips == 0 and kd.kendall_tau == 1.0
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
    assert kd.gap_range > 1e-3 * abs(kd.gap_mean) and not kd.gap_constant  # depends on the model
    subsets = consistency(
        tables["size"], {"options": {"weights": "size", "kd_estimator": "subsets"}}
    )
    assert subsets.set_index("metric").loc["kd", "verdict"] == "not guaranteed"
    unknown = consistency(tables["size"]).set_index("metric").loc["kd"]
    assert unknown.verdict == "safe"
    assert unknown.why.endswith(" (options not recorded: assuming weights n_i/n)")


def test_flipped_pairs_follow_each_metrics_direction(tidy):
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


def test_rounding_level_is_ulps_of_the_largest_value_in_its_dtype():
    # machine epsilon: 2^-52 in float64, 2^-23 in float32 (IEEE 754 binary64 / binary32)
    assert rounding_level(np.array([0.5, -2.0])) == ROUNDING_ULPS * 2.0**-52 * 2.0
    assert rounding_level(np.array([0.5, -2.0], np.float32)) == ROUNDING_ULPS * 2.0**-23 * 2.0
    assert rounding_level(np.array([np.nan, np.inf, 1.0])) == ROUNDING_ULPS * 2.0**-52
    assert rounding_level(np.zeros(3)) == 0.0 and rounding_level(np.array([np.nan])) == 0.0
    # 0.1 + 0.2 - 0.3 is one float64 rounding: within the level; 1e-9 is a difference
    assert 0 < (0.1 + 0.2) - 0.3 <= rounding_level(np.array([0.3])) < 1e-9
