"""E2 (Proposition 1): G2 has G1's FD at every client, a different FD_all; KD separates them.

FDs are recomputed here with scipy's sqrtm (experiments_testkit.fd_scipy), not with the
distrank implementation the construction uses.
"""

import numpy as np
import pytest
from experiments_testkit import clustered_clients, fd_scipy, kd_vstat, score_models

from distrank.experiments.e2_fd_counterexample import construct_g2, design_g2, e2_figure, e2_table
from distrank.figures import save


@pytest.fixture(scope="module")
def six_clients():
    """Six one-cluster clients (low within-, high between-client variance) and G1:
    held-out samples of the same six clusters."""
    rng = np.random.default_rng(7)
    x, labels, means = clustered_clients(rng, k=6, d=10)
    y1 = np.concatenate([m + 0.4 * rng.standard_normal((70, 10)) for m in means])
    return x, labels, y1


def _fds(x, labels, y):
    clients = np.unique(labels)
    lam = np.array([(labels == c).sum() for c in clients]) / len(labels)
    per_client = np.array([fd_scipy(x[labels == c], y) for c in clients])
    return per_client, float(lam @ per_client), fd_scipy(x, y)


def test_same_fd_per_client_and_avg_different_all(six_clients):
    x, labels, y1 = six_clients
    y2 = construct_g2(x, labels, y1)
    assert y2.shape == y1.shape
    client1, avg1, all1 = _fds(x, labels, y1)
    client2, avg2, all2 = _fds(x, labels, y2)
    np.testing.assert_allclose(client2, client1, rtol=1e-8)
    assert abs(avg2 - avg1) / avg1 < 1e-4
    assert abs(all2 - all1) / all1 > 0.2


def test_kd_ranks_g1_better(six_clients):
    x, labels, y1 = six_clients
    y2 = construct_g2(x, labels, y1)
    clients = np.unique(labels)
    lam = np.array([(labels == c).sum() for c in clients]) / len(labels)
    kd_avg = [lam @ [kd_vstat(x[labels == c], y) for c in clients] for y in (y1, y2)]
    kd_all = [kd_vstat(x, y) for y in (y1, y2)]
    assert kd_all[0] < kd_all[1] and kd_avg[0] < kd_avg[1]


def test_design_predicts_the_fd_all_change(six_clients):
    """FD_all(G2) - FD_all(G1) = 2 (1 - s)(t_all - T), and the shrink is s = T / b."""
    x, labels, y1 = six_clients
    design = design_g2(x, labels, y1)
    _, _, all1 = _fds(x, labels, y1)
    _, _, all2 = _fds(x, labels, design.apply(y1))
    assert all2 - all1 == pytest.approx(design.fd_all_change, rel=1e-8)
    assert 0 < design.scale < 1
    np.testing.assert_allclose(design.fd_client_change, 0.0, atol=1e-8 * design.fd_client_g1.max())
    np.testing.assert_allclose(design.center, y1.mean(0))


def test_uniform_weights_float32_and_explicit_scale(six_clients):
    x, labels, y1 = six_clients
    y2 = construct_g2(x, labels, y1, weights="uniform", scale=0.5).astype(np.float32)
    client1, _, all1 = _fds(x, labels, y1)
    client2, _, all2 = _fds(x, labels, y2.astype(np.float64))
    assert abs(client2.mean() - client1.mean()) / client1.mean() < 1e-5
    assert all2 > 1.2 * all1
    np.testing.assert_allclose(
        y2.mean(0) - y1.mean(0),
        design_g2(x, labels, y1, weights="uniform", scale=0.5).shift,
        atol=1e-4,
    )


def test_rejects_bad_input(six_clients):
    x, labels, y1 = six_clients
    with pytest.raises(ValueError, match=r"^scale must be positive"):
        design_g2(x, labels, y1, scale=-1.0)
    with pytest.raises(ValueError, match=r"^weights: expected one of "):
        design_g2(x, labels, y1, weights="equal")
    with pytest.raises(ValueError, match="one label per"):
        design_g2(x, labels[:-1], y1)


def test_table_and_figure(six_clients, tmp_path):
    x, labels, y1 = six_clients
    scores = score_models(x, labels, {"heldout": y1, "g2": construct_g2(x, labels, y1)})
    table = e2_table(scores, g1="heldout", g2="g2")
    assert table["client"].tolist() == [str(i) for i in range(6)] + ["avg", "all"]
    fd = table.set_index("client")
    client1, avg1, all1 = _fds(x, labels, y1)
    np.testing.assert_allclose(fd["FD_G1"].to_numpy(), [*client1, avg1, all1])
    np.testing.assert_allclose(fd.loc[[str(i) for i in range(6)], "FD_rel_diff"], 0.0, atol=1e-8)
    assert fd.loc["all", "FD_rel_diff"] > 0.2 and fd.loc["all", "KD_G2"] > fd.loc["all", "KD_G1"]
    fig = e2_figure(table, "EfficientNet-Lite0")
    assert all("EfficientNet-Lite0" in ax.get_ylabel() for ax in fig.axes)
    assert set(save(fig, tmp_path / "E2_prop1")) == {"pdf", "png"}
