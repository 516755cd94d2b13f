"""Score tables for the report's tests: one scored by the package, one written by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


@pytest.fixture(scope="package")
def scored():
    """Scores of four models on three heterogeneous clients, by the package's scorer."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from distrank.metrics import score

    rng = np.random.default_rng(11)
    clients = np.repeat(["a", "b", "c"], [30, 45, 25])
    x = rng.normal(size=(100, 3)) + (clients == "b")[:, None] * 1.5 - (clients == "c")[:, None]
    models = {
        "wide": rng.normal(0, 1.6, (40, 3)),
        "narrow": rng.normal(0, 0.4, (40, 3)),
        "shifted": rng.normal(0.8, 1.0, (40, 3)),
        "close": rng.normal(0.1, 1.1, (40, 3)),
    }
    tables = {
        w: score(x, clients, models, kd_estimator="biased", weights=w, dtype="float64")
        for w in ("size", "uniform")
    }
    return x, clients, tables


def tidy_table(values: dict[str, dict[str, tuple[float, float]]]) -> pd.DataFrame:
    """{metric: {model: (all, avg)}} -> a tidy table."""
    rows = [
        (model, metric, agg, "", v)
        for metric, by_model in values.items()
        for model, pair in by_model.items()
        for agg, v in zip(("all", "avg"), pair)
    ]
    return pd.DataFrame(rows, columns=["model", "metric", "aggregation", "client", "value"])


@pytest.fixture
def tidy():
    """:func:`tidy_table`: {metric: {model: (all, avg)}} -> a tidy table."""
    return tidy_table
