"""Partition schemes and manifests (distrank.clients)."""

import json

import numpy as np
import pytest
from sklearn.cluster import KMeans

from distrank.clients import (
    UNASSIGNED,
    client_sizes,
    load_manifest,
    partition,
    save_manifest,
)

N_CLASSES = 10


@pytest.fixture
def labels():
    # 100 rows per class, shuffled so class order says nothing about row order.
    return np.random.default_rng(0).permutation(np.repeat(np.arange(N_CLASSES), 100))


def mean_max_class_fraction(labels, clients):
    """How dominated each client is by its most common class, averaged over clients."""
    return np.mean(
        [
            np.bincount(labels[clients == c], minlength=N_CLASSES).max() / np.sum(clients == c)
            for c in client_sizes(clients)
        ]
    )


def test_by_class_is_exact(labels):
    groups = [[0, 1], [2, 3, 4], [9]]
    clients = partition(labels, scheme={"kind": "by_class", "groups": groups}, seed=0)
    for client, group in enumerate(groups):
        assert np.array_equal(clients == client, np.isin(labels, group))
    assert np.array_equal(clients == UNASSIGNED, np.isin(labels, [5, 6, 7, 8]))
    assert client_sizes(clients) == {0: 200, 1: 300, 2: 100}


def test_one_class(labels):
    clients = partition(labels, scheme={"kind": "one_class"}, seed=0)
    assert np.array_equal(clients, labels)
    subset = partition(labels, scheme={"kind": "one_class", "classes": [7, 2]}, seed=0)
    assert np.array_equal(subset == 0, labels == 7)
    assert np.array_equal(subset == 1, labels == 2)
    assert np.sum(subset == UNASSIGNED) == 800


@pytest.mark.parametrize("alpha", [0.3, 1.0, 100.0])
def test_dirichlet_covers_every_row_and_respects_min_rows(labels, alpha):
    scheme = {"kind": "dirichlet", "n_clients": 5, "alpha": alpha, "min_rows": 20}
    clients = partition(labels, scheme=scheme, seed=3)
    sizes = client_sizes(clients)
    assert sorted(sizes) == list(range(5))
    assert sum(sizes.values()) == len(labels)
    assert min(sizes.values()) >= 20


def test_dirichlet_skew_grows_as_alpha_shrinks(labels):
    def skew(alpha):
        scheme = {"kind": "dirichlet", "n_clients": 5, "alpha": alpha, "min_rows": 1}
        return np.mean(
            [
                mean_max_class_fraction(labels, partition(labels, scheme=scheme, seed=s))
                for s in range(5)
            ]
        )

    skews = [skew(a) for a in (0.1, 1.0, 1000.0)]
    assert skews[0] > skews[1] > skews[2]
    # alpha -> infinity is the iid split: every client holds about 1/10 of each class.
    assert skews[2] < 0.15


def test_kmeans_matches_sklearn(labels):
    features = np.random.default_rng(1).normal(size=(len(labels), 4)) + labels[:, None]
    clients = partition(
        labels, scheme={"kind": "kmeans", "n_clients": 4}, seed=7, features=features
    )
    expected = KMeans(n_clusters=4, n_init=10, random_state=7).fit_predict(features)
    assert np.array_equal(clients, expected)


@pytest.mark.parametrize(
    "scheme",
    [
        {"kind": "dirichlet", "n_clients": 6, "alpha": 0.5},
        {"kind": "kmeans", "n_clients": 3},
        {"kind": "one_class"},
    ],
)
def test_deterministic_under_seed(labels, scheme):
    features = np.random.default_rng(1).normal(size=(len(labels), 3))
    run = lambda seed: partition(labels, scheme=scheme, seed=seed, features=features)  # noqa: E731
    assert np.array_equal(run(11), run(11))
    if scheme["kind"] == "dirichlet":
        assert not np.array_equal(run(11), run(12))


@pytest.mark.parametrize(
    "scheme, key",
    [
        ({"kind": "stripes"}, "kind"),
        ({"groups": [[0]]}, "kind"),
        ({"kind": "by_class", "groups": [[0]], "n_clients": 2}, "n_clients"),
        ({"kind": "by_class"}, "groups"),
        ({"kind": "by_class", "groups": [[0, 1], [1]]}, "groups"),
        ({"kind": "by_class", "groups": [[0], [42]]}, "groups"),
        ({"kind": "by_class", "groups": [0, 1]}, "groups"),
        ({"kind": "dirichlet", "n_clients": 3}, "alpha"),
        ({"kind": "dirichlet", "n_clients": 3, "alpha": 0}, "alpha"),
        ({"kind": "dirichlet", "n_clients": 0, "alpha": 1.0}, "n_clients"),
        ({"kind": "dirichlet", "n_clients": 3, "alpha": 1.0, "min_row": 5}, "min_row"),
        ({"kind": "dirichlet", "n_clients": 20, "alpha": 1.0, "min_rows": 100}, "min_rows"),
        ({"kind": "one_class", "alpha": 1.0}, "alpha"),
        ({"kind": "one_class", "classes": 3}, "classes"),
        ({"kind": "one_class", "classes": [3, 3]}, "classes"),
        ({"kind": "one_class", "classes": [3, 11]}, "classes"),
        ({"kind": "kmeans", "n_clients": 3}, "features"),
    ],
)
def test_bad_schemes_name_the_key(labels, scheme, key):
    with pytest.raises(
        ValueError, match=rf"^scheme (key |keys '\w+'/|'kmeans' needs the argument )'{key}'"
    ):
        partition(labels, scheme=scheme, seed=0)


def test_dirichlet_gives_up_with_a_clear_error(labels):
    # alpha -> 0 puts each class on one client: 20 clients cannot all get 10 classes' rows.
    scheme = {"kind": "dirichlet", "n_clients": 20, "alpha": 1e-3, "min_rows": 10}
    with pytest.raises(
        ValueError,
        match=r"^scheme 'dirichlet': no draw in 1000 gave every one of 20 clients >= min_rows=10",
    ):
        partition(labels, scheme=scheme, seed=0)


def test_bad_arguments(labels):
    with pytest.raises(ValueError, match=r"^argument 'labels' must be a 1-d int array"):
        partition(labels.astype(float), scheme={"kind": "one_class"}, seed=0)
    with pytest.raises(ValueError, match=r"^argument 'seed': expected an integer >= 0"):
        partition(labels, scheme={"kind": "one_class"}, seed=-1)
    with pytest.raises(ValueError, match=r"^argument 'features' must have shape \(1000, d\)"):
        partition(
            labels, scheme={"kind": "kmeans", "n_clients": 2}, seed=0, features=np.zeros((3, 2))
        )


def test_manifest_round_trip(tmp_path, labels):
    clients = partition(labels, scheme={"kind": "by_class", "groups": [[0, 1], [2]]}, seed=0)
    path = tmp_path / "sub" / "manifest.csv"
    save_manifest(path, clients, scheme={"kind": "by_class"}, seed=0)
    assert np.array_equal(load_manifest(path), clients)
    lines = path.read_text().splitlines()
    assert lines[0] == "row,client"
    assert lines[1] == f"0,{clients[0]}"
    meta = json.loads((tmp_path / "sub" / "manifest.csv.meta.json").read_text())
    assert meta["seed"] == 0 and meta["n"] == len(labels)
    assert meta["sizes"] == {"0": 200, "1": 100}
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "manifest.csv",
        "manifest.csv.meta.json",
    ]


def test_load_manifest_rejects_bad_files(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("client,row\n0,0\n")
    with pytest.raises(ValueError, match=r"m\.csv: header must be 'row,client', got 'client,row'$"):
        load_manifest(path)
    path.write_text("row,client\n0,0\n2,1\n")
    with pytest.raises(ValueError, match="in order"):
        load_manifest(path)


def test_unlabelled_data_partition_by_kmeans_only():
    features = np.random.default_rng(0).normal(size=(60, 3))
    owner = partition(None, scheme={"kind": "kmeans", "n_clients": 3}, seed=0, features=features)
    expected = KMeans(n_clusters=3, n_init=10, random_state=0).fit_predict(features)
    np.testing.assert_array_equal(owner, expected)
    with pytest.raises(ValueError, match="'labels' is None"):
        partition(None, scheme={"kind": "one_class"}, seed=0, features=features)
