"""Partition a reference set among clients.

A partition maps every reference row to a client id: an int in ``0..K-1``, or
``UNASSIGNED`` (-1) for a row that no client holds (e.g. a class outside the
``groups`` of a ``by_class`` scheme). Schemes are plain dicts, as written in
``config.yaml``:

============  ===========================================  =======================
kind          keys                                         who holds what
============  ===========================================  =======================
by_class      groups: [[0, 1], [2, 3], ...]                client i: classes groups[i]
dirichlet     n_clients, alpha, min_rows (default 10)      label skew, Dirichlet(alpha)
one_class     classes (optional, default all labels)       client i: one class
kmeans        n_clients (needs ``features``)               k-means clusters of features
============  ===========================================  =======================

Every scheme is a pure function of (labels, features, scheme, seed). A manifest
stores a partition as CSV (``row,client``) with a JSON sidecar for its metadata.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from distrank._checks import positive_int
from distrank._io import atomic_open, write_json

__all__ = [
    "UNASSIGNED",
    "SCHEMES",
    "NEEDS_LABELS",
    "WEIGHTS",
    "partition",
    "n_clients",
    "client_weights",
    "client_sizes",
    "save_manifest",
    "load_manifest",
    "ClientGroups",
    "client_groups",
]

#: Client id of a row that belongs to no client.
UNASSIGNED = -1

#: Resampling attempts before the Dirichlet scheme gives up on ``min_rows``.
_DIRICHLET_TRIES = 1000
#: k-means restarts; fixed so a partition depends only on (features, K, seed).
_KMEANS_N_INIT = 10


def _by_class(labels, features, seed, *, groups):
    return _assign_groups(labels, groups, "groups")


def _one_class(labels, features, seed, *, classes=None):
    if classes is None:
        classes = np.unique(labels).tolist()
    elif not isinstance(classes, (list, tuple)) or not classes:
        raise ValueError(f"scheme key 'classes' must be a non-empty list, got {classes!r}")
    return _assign_groups(labels, [[c] for c in classes], "classes")


def _assign_groups(labels, groups, key):
    """Client i holds the rows whose class is in groups[i]; ``key`` names the scheme key."""
    if not isinstance(groups, (list, tuple)) or not groups:
        raise ValueError(f"scheme key {key!r} must be a non-empty list, got {groups!r}")
    owner = {}
    for client, group in enumerate(groups):
        if not isinstance(group, (list, tuple)) or not group:
            raise ValueError(
                f"scheme key {key!r}: group {client} must be a non-empty "
                f"list of classes, got {group!r}"
            )
        for c in group:
            if c in owner:
                raise ValueError(
                    f"scheme key {key!r}: class {c} is given twice "
                    f"(clients {owner[c]} and {client})"
                )
            owner[c] = client
    clients = np.full(len(labels), UNASSIGNED, dtype=np.int64)
    for c, client in owner.items():
        clients[labels == c] = client
    empty = sorted(set(range(len(groups))) - set(client_sizes(clients)))
    if empty:
        raise ValueError(
            f"scheme key {key!r}: clients {empty} have no rows (classes absent from 'labels')"
        )
    return clients


def _dirichlet(labels, features, seed, *, n_clients, alpha, min_rows=10):
    """Label skew: each class's rows are split among clients by Dirichlet(alpha) shares.

    Small ``alpha`` gives each client few classes; large ``alpha`` tends to iid.
    A draw that leaves some client with fewer than ``min_rows`` rows is redrawn.
    """
    positive_int(n_clients, "scheme key 'n_clients'")
    if not alpha > 0:
        raise ValueError(f"scheme key 'alpha' must be > 0, got {alpha!r}")
    positive_int(min_rows, "scheme key 'min_rows'", minimum=0)
    if n_clients * min_rows > len(labels):
        raise ValueError(
            f"scheme keys 'n_clients'/'min_rows': {n_clients} clients x {min_rows} rows "
            f"exceeds the {len(labels)} rows available"
        )
    rng = np.random.default_rng(seed)
    rows_by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(_DIRICHLET_TRIES):
        clients = np.empty(len(labels), dtype=np.int64)
        for rows in rows_by_class:
            rows = rng.permutation(rows)
            shares = rng.dirichlet(np.full(n_clients, float(alpha)))
            cuts = np.round(np.cumsum(shares)[:-1] * len(rows)).astype(np.int64)
            for client, part in enumerate(np.split(rows, cuts)):
                clients[part] = client
        if np.bincount(clients, minlength=n_clients).min() >= min_rows:
            return clients
    raise ValueError(
        f"scheme 'dirichlet': no draw in {_DIRICHLET_TRIES} gave every one of "
        f"{n_clients} clients >= min_rows={min_rows} rows at alpha={alpha}; "
        "raise 'alpha', or lower 'n_clients' or 'min_rows'"
    )


def _kmeans(labels, features, seed, *, n_clients):
    from sklearn.cluster import KMeans

    positive_int(n_clients, "scheme key 'n_clients'")
    if features is None:
        raise ValueError("scheme 'kmeans' needs the argument 'features'")
    km = KMeans(n_clusters=n_clients, n_init=_KMEANS_N_INIT, random_state=seed)
    return km.fit_predict(features).astype(np.int64)


#: kind -> (function, required keys, optional keys)
SCHEMES = {
    "by_class": (_by_class, {"groups"}, set()),
    "dirichlet": (_dirichlet, {"n_clients", "alpha"}, {"min_rows"}),
    "one_class": (_one_class, set(), {"classes"}),
    "kmeans": (_kmeans, {"n_clients"}, set()),
}
#: Schemes that split by class label (all but kmeans, which clusters features).
NEEDS_LABELS = frozenset({"by_class", "dirichlet", "one_class"})
#: Client weighting schemes of D_avg (see ``client_weights``).
WEIGHTS = ("size", "uniform")


def n_clients(scheme: Mapping, n_classes: int | None = None) -> int:
    """The number of clients of a scheme, from the scheme alone.

    Parameters
    ----------
    scheme : mapping
        ``{"kind": ..., **keys}`` (module doc).
    n_classes : int, optional
        The classes of the labels: a one_class scheme without ``classes`` has one
        client per class.

    Returns
    -------
    int
    """
    kind = scheme["kind"]
    if kind == "by_class":
        return len(scheme["groups"])
    if kind == "one_class":
        if "classes" in scheme:
            return len(scheme["classes"])
        if n_classes is None:
            raise ValueError(
                "scheme 'one_class' without 'classes' has one client per class: pass n_classes"
            )
        return n_classes
    return scheme["n_clients"]


def client_weights(sizes, scheme: str = "size") -> np.ndarray:
    r"""The weights :math:`\lambda_i` of D_avg = sum_i lambda_i D(X_i, Y).

    Parameters
    ----------
    sizes : array_like, shape (k,)
        The clients' row counts n_i, positive.
    scheme : {"size", "uniform"}
        ``"size"``: :math:`\lambda_i = n_i / n`, the only weights under which KD_avg -
        KD_all is model-free (Theorem 1 of Wang et al., arXiv 2310.11714);
        ``"uniform"``: 1 / k.

    Returns
    -------
    numpy.ndarray, shape (k,)
        float64, summing to 1.
    """
    if scheme not in WEIGHTS:
        raise ValueError(f"weights: expected one of {WEIGHTS}, got {scheme!r}")
    sizes = np.asarray(sizes, dtype=np.float64)
    if sizes.ndim != 1 or sizes.size == 0 or (sizes <= 0).any():
        raise ValueError(f"weights: client sizes must be positive counts, got {sizes.tolist()}")
    if scheme == "size":
        return sizes / sizes.sum()
    return np.full(len(sizes), 1.0 / len(sizes))


def average(local, weights):
    """D_avg = sum_i lambda_i D_i: the clients' values ``local`` (clients on the last
    axis; batches of them at once) under the weights lambda_i (``client_weights``).
    A float for one set of values."""
    out = np.asarray(local, np.float64) @ np.asarray(weights, np.float64)
    return float(out) if out.ndim == 0 else out


def partition(labels, *, scheme: Mapping, seed: int, features=None) -> np.ndarray:
    """Assign each reference row to a client.

    Parameters
    ----------
    labels : array of int, shape (N,), or None
        Class label of each reference row; None for unlabelled data (kmeans only).
    scheme : mapping
        ``{"kind": ..., **keys}``; see the module docstring for kinds and keys.
    seed : int
        Seed of every random choice; the same inputs and seed give the same partition.
    features : array, shape (N, d), optional
        Feature vectors; required by ``kind="kmeans"`` only.

    Returns
    -------
    np.ndarray of int64, shape (N,)
        Client id per row, ``0..K-1``, or ``UNASSIGNED`` (-1).
    """
    if labels is None:
        if scheme.get("kind") != "kmeans" or features is None:
            raise ValueError(
                "argument 'labels' is None: only scheme 'kmeans' (with "
                "'features') partitions unlabelled data"
            )
        labels = np.zeros(len(features), dtype=np.int64)
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"argument 'labels' must be a 1-d int array, got {labels.dtype} {labels.shape}"
        )
    positive_int(seed, "argument 'seed'", minimum=0)
    if features is not None:
        features = np.asarray(features)
        if features.ndim != 2 or len(features) != len(labels):
            raise ValueError(
                f"argument 'features' must have shape ({len(labels)}, d), got {features.shape}"
            )
    if "kind" not in scheme:
        raise ValueError("scheme key 'kind' is missing")
    kind = scheme["kind"]
    if kind not in SCHEMES:
        raise ValueError(f"scheme key 'kind': unknown {kind!r}; expected one of {sorted(SCHEMES)}")
    fn, required, optional = SCHEMES[kind]
    keys = set(scheme) - {"kind"}
    for key in sorted(keys - required - optional):
        raise ValueError(f"scheme key {key!r} is not valid for kind {kind!r}")
    for key in sorted(required - keys):
        raise ValueError(f"scheme key {key!r} is required for kind {kind!r}")
    params = {k: scheme[k] for k in keys}
    return fn(labels, features, int(seed), **params)


def client_sizes(clients) -> dict[int, int]:
    """Rows per client; unassigned rows are left out.

    Parameters
    ----------
    clients : array_like of int, shape (n,)
        Each row's client id (:func:`partition`).

    Returns
    -------
    dict
        ``{client: n_i}`` in client order.
    """
    ids, counts = np.unique(np.asarray(clients), return_counts=True)
    return {int(i): int(n) for i, n in zip(ids, counts) if i != UNASSIGNED}


def save_manifest(path, clients, **meta) -> None:
    """Write a partition as CSV ``row,client`` and its metadata to ``<path>.meta.json``.

    Both files are written atomically.

    Parameters
    ----------
    path : str or path-like
        The CSV file.
    clients : array_like of int, shape (n,)
        Each row's client id.
    **meta
        JSON-serialisable metadata (scheme, seed, source, ...), stored with ``n`` (rows)
        and ``sizes`` (rows per client).
    """
    clients = np.asarray(clients)
    if clients.ndim != 1 or not np.issubdtype(clients.dtype, np.integer):
        raise ValueError(f"argument 'clients' must be a 1-d int array, got {clients.dtype}")
    path = Path(path)
    rows = np.column_stack([np.arange(len(clients)), clients])
    with atomic_open(path) as f:
        np.savetxt(f, rows, fmt="%d", delimiter=",", header="row,client", comments="")
    sizes = {str(k): v for k, v in client_sizes(clients).items()}
    write_json(_meta_path(path), {**meta, "n": len(clients), "sizes": sizes})


def load_manifest(path) -> np.ndarray:
    """Read a manifest written by :func:`save_manifest`.

    Parameters
    ----------
    path : str or path-like
        The CSV file; its metadata is in ``<path>.meta.json`` (plain JSON).

    Returns
    -------
    numpy.ndarray of int64, shape (n,)
        Each row's client id.
    """
    path = Path(path)
    with open(path) as f:
        header = f.readline().strip()
        if header != "row,client":
            raise ValueError(f"{path}: header must be 'row,client', got {header!r}")
        rows = np.loadtxt(f, dtype=np.int64, delimiter=",", ndmin=2)
    if rows.size == 0:
        return np.empty(0, dtype=np.int64)
    if rows.shape[1] != 2 or not np.array_equal(rows[:, 0], np.arange(len(rows))):
        raise ValueError(f"{path}: rows must be 0..N-1 in order, one 'row,client' pair per line")
    return rows[:, 1].copy()


def client_features(reference_path, manifest_path, client: int) -> np.ndarray:
    """The rows of a reference feature file that the manifest assigns to ``client``."""
    from distrank.features.cache import load_features

    return load_features(reference_path)[load_manifest(manifest_path) == client]


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".meta.json")


@dataclass(frozen=True)
class ClientGroups:
    """The clients of a reference set: sorted labels, each row's client, sizes.

    Attributes
    ----------
    names
        list of str, length k: ``str`` of each sorted distinct label (the names the
        score tables use).
    index
        numpy.ndarray of int64, shape (n,): the client of each reference row, in 0..k-1.
    sizes
        numpy.ndarray of int64, shape (k,): rows per client.
    """

    names: list[str]
    index: np.ndarray  # (n,) int64, client of each row
    sizes: np.ndarray  # (k,) int64, rows per client

    def weights(self, scheme: str) -> np.ndarray:
        """lambda_i of :func:`distrank.clients.client_weights`."""
        return client_weights(self.sizes, scheme)

    def rows(self, c: int) -> np.ndarray:
        """Indices of the reference rows of client c."""
        return np.flatnonzero(self.index == c)


def client_groups(clients, n: int) -> ClientGroups:
    """Group ``n`` reference rows by their client labels.

    Parameters
    ----------
    clients : array_like, shape (n,)
        Each row's client label, int or str (numpy or torch).
    n : int
        The reference's rows.

    Returns
    -------
    ClientGroups

    Raises
    ------
    ValueError
        Naming ``clients``: a wrong shape or dtype, or labels equal as strings.
    """
    torch = sys.modules.get("torch")  # a tensor implies torch is loaded; this module is torch-free
    if torch is not None and isinstance(clients, torch.Tensor):
        clients = clients.detach().cpu().numpy()
    labels = np.asarray(clients)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(
            f"clients: expected {n} labels (one per reference row), got shape {labels.shape}"
        )
    if labels.dtype.kind not in "iuU":
        raise ValueError(f"clients: expected int or str labels, got dtype {labels.dtype}")
    unique, index, sizes = np.unique(labels, return_inverse=True, return_counts=True)
    names = [str(u) for u in unique.tolist()]
    if len(set(names)) != len(names):
        raise ValueError(f"clients: labels are not distinct as strings: {names}")
    return ClientGroups(names, index.astype(np.int64), sizes.astype(np.int64))


def common_refinement(partitions: Sequence[np.ndarray]) -> np.ndarray:
    """Fine group of each row: two rows share a group iff every partition puts them
    in the same client. ``partitions`` are (n,) client index arrays; returns (n,) int64
    in 0..B-1, every partition being a coarsening of it."""
    stacked = np.stack([np.asarray(p) for p in partitions], axis=1)
    _, fine = np.unique(stacked, axis=0, return_inverse=True)
    return fine.reshape(-1).astype(np.int64)
