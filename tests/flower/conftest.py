"""Three sites' reference features and two models' generated features (synthetic, seeded)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

D = 6
SITES = {"oslo": (0.0, 60), "paris": (1.0, 80), "rome": (-0.5, 100)}  # offset, rows


@pytest.fixture(scope="session")
def federation():
    """(site -> (n_i, d) features, model -> (m, d) features): sites differ in mean and size."""
    rng = np.random.default_rng(1442)
    sites = {s: rng.normal(size=(n, D)) + off for s, (off, n) in SITES.items()}
    models = {
        "sharp": rng.normal(0.2, 1.0, size=(70, D)),
        "broad": rng.normal(0.0, 2.0, size=(90, D)),
    }
    return sites, models


@pytest.fixture(scope="session")
def reference(federation):
    """The pooled reference and its client labels, as ``distrank score`` takes them."""
    sites, _ = federation
    x = np.concatenate(list(sites.values()))
    labels = np.repeat(list(sites), [len(v) for v in sites.values()])
    return x, labels


@pytest.fixture
def server_process(monkeypatch):
    """The identity Flower gives a ServerApp process (messages are stamped with it)."""
    for attr, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)
