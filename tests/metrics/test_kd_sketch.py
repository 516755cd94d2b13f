"""``kd_sketch``, KD from kernel mean sketches, as one metric of the engine: its values are
the U-statistic KD of the sketched kernel, computed here from the explicit Gram matrix of
the random features (no sketch code); Theorem 1 holds for it (avg - all is the same for
every model); the bootstrap reaches it by scoring every resample afresh."""

from __future__ import annotations

import numpy as np
import pytest

from distrank.metrics import score
from distrank.metrics.sketch._family import DIM
from distrank.metrics.sketch._maps import FeatureMap

H = 2.5


def gram_kd(phi_x, phi_y) -> float:
    """U-statistic KD of the kernel phi(a).phi(b), from the explicit Gram matrices."""

    def u(p):
        k = p @ p.T
        return (k.sum() - np.trace(k)) / (len(p) * (len(p) - 1))

    return u(phi_x) + u(phi_y) - 2 * (phi_x @ phi_y.T).mean()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(90, 4)) + np.repeat([[0.0], [0.5], [1.0]], 30, axis=0)
    labels = np.repeat(["a", "b", "c"], 30)
    models = {"near": rng.normal(0.5, 1.0, (60, 4)), "far": rng.normal(2.0, 1.0, (50, 4))}
    return x, labels, models


def test_kd_sketch_is_the_u_statistic_of_the_sketched_kernel(data):
    x, labels, models = data
    table = score(
        x,
        labels,
        models,
        metrics=["kd_sketch"],
        kernel="rbf",
        kernel_params={"bandwidth": H},
        seed=7,
        dtype="float64",
    )
    fmap = FeatureMap(4, DIM, H, seed=7)
    phi = {name: fmap.features(y) for name, y in models.items()}
    for r in table.itertuples():
        rows = x if r.aggregation == "all" else x[labels == r.client]
        if r.aggregation == "avg":
            continue
        assert r.value == pytest.approx(gram_kd(fmap.features(rows), phi[r.model]), rel=1e-9)
    offset = table.pivot_table(index="model", columns="aggregation", values="value")
    gaps = (offset["avg"] - offset["all"]).to_numpy()
    assert gaps[0] == pytest.approx(gaps[1], abs=1e-12)  # Theorem 1: model-free


def test_kd_sketch_needs_the_rbf_kernel(data):
    x, labels, models = data
    with pytest.raises(ValueError, match="kd_sketch: the sketch is of the rbf kernel"):
        score(
            x,
            labels,
            models,
            metrics=["kd_sketch"],
            kernel="laplace",
            kernel_params={"bandwidth": H},
        )


def test_kd_sketch_reaches_the_bootstrap_by_scoring_afresh(data):
    from distrank.metrics._bootstrap import bootstrap_scores, flat_summary
    from distrank.metrics._options import ScoreOptions

    x, labels, models = data
    opts = ScoreOptions(
        metrics=("kd_sketch",),
        kernel="rbf",
        kernel_params={"bandwidth": H},
        seed=7,
        dtype="float64",
    )
    result = bootstrap_scores(x, labels, models, opts, summary=flat_summary, n_resamples=8)
    table = score(x, labels, models, opts).query("aggregation == 'all'").set_index("model")
    assert np.array_equal(result.point.values[0, :, 0], table.value[list(models)].to_numpy())
    assert result.distribution.shape[-1] == 8 and np.isfinite(result.distribution).all()
