"""E6: PRDC all vs avg. Scores come from the reference `prdc` package (Naeem et al.),
independent of distrank; Recall_all equals the size-weighted Recall_avg exactly."""

import numpy as np
import pytest
from experiments_testkit import clustered_clients, tidy
from scipy import stats

from distrank.figures import e6_figure, e6_table, save
from distrank.metrics._metric import PRDC


@pytest.fixture(scope="module")
def prdc_scores():
    prdc = pytest.importorskip("prdc")
    rng = np.random.default_rng(5)
    x, labels, means = clustered_clients(rng, k=4, d=5, sizes=[40, 60, 50, 70])
    clients = np.unique(labels)
    lam = np.array([(labels == c).sum() for c in clients]) / len(labels)
    models = {
        f"m{i}": means[rng.integers(0, 4, 120)] + scale * rng.standard_normal((120, 5)) + shift
        for i, (scale, shift) in enumerate(
            [(0.3, 0), (0.6, 0), (1.2, 0), (0.4, 0.8), (2.0, 0), (0.5, 0.3)]
        )
    }
    rows = []
    for name, y in models.items():
        pooled = prdc.compute_prdc(x, y, nearest_k=3)
        per_client = [prdc.compute_prdc(x[labels == c], y, nearest_k=3) for c in clients]
        for metric in PRDC:
            values = np.array([r[metric] for r in per_client])
            rows += [
                (name, metric, "all", "", float(pooled[metric])),
                (name, metric, "avg", "", float(lam @ values)),
            ]
    return tidy(rows)


def test_recall_all_equals_avg(prdc_scores):
    table, agreement = e6_table(prdc_scores)
    assert table["Recall_absdiff"].max() < 1e-12
    row = agreement.set_index("metric").loc["Recall"]
    assert (
        row["kendall_tau"] == pytest.approx(1.0)
        and row["rank_flips"] == 0
        and row["max_absdiff"] < 1e-12
    )


def test_table_matches_scores(prdc_scores):
    table, agreement = e6_table(prdc_scores)
    values = prdc_scores.set_index(["model", "metric", "aggregation"])["value"]
    for metric, name in zip(PRDC, ["Precision", "Recall", "Density", "Coverage"]):
        all_v = np.array([values[(m, metric, "all")] for m in table["model"]])
        avg_v = np.array([values[(m, metric, "avg")] for m in table["model"]])
        np.testing.assert_array_equal(table[f"{name}_all"], all_v)
        np.testing.assert_allclose(table[f"{name}_absdiff"], np.abs(all_v - avg_v))
        np.testing.assert_array_equal(
            table[f"{name}_all_rank"], stats.rankdata(-all_v, method="min")
        )
        expected_tau = stats.kendalltau(avg_v, all_v).statistic
        assert agreement.set_index("metric").loc[name, "kendall_tau"] == pytest.approx(
            expected_tau, nan_ok=True
        )


def test_figure(prdc_scores, tmp_path):
    table, _ = e6_table(prdc_scores)
    fig = e6_figure(table, "EfficientNet-Lite0")
    assert len(fig.axes) == 4
    for ax, name in zip(fig.axes, ["Precision", "Recall", "Density", "Coverage"]):
        assert ax.get_xlabel() == rf"{name}$_\mathrm{{all}}$ on EfficientNet-Lite0 features"
        assert ax.get_ylabel().startswith(name)
    assert set(save(fig, tmp_path / "E6_prdc")) == {"pdf", "png"}
