"""FD of many partitions of one reference: every model against the pool and every client
of every partition, sharing one product of the reference with each model
(``metrics._reaggregate``'s doc; the pairs themselves: :mod:`distrank.metrics.fd`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np
import torch

from distrank.metrics.fd._bands import _gram, _root_sum, sqrt_factor
from distrank.metrics.fd._frechet import one_thread_each

_FD_BLOCK = 4096  # rows per step of the FD sums over many rows
log = logging.getLogger(__name__)


def partition_fds(x, groups: Mapping, ys: Mapping, dev) -> dict:
    """FD of every model against the pool and every client of every partition.

    One product of the reference with each model serves them all
    (``metrics._reaggregate``'s doc); every row is centred on the pool's mean and every
    sum is in float64.

    Parameters
    ----------
    x
        (n, d) torch tensor of the pooled reference rows.
    groups
        partition name -> ``distrank.clients.ClientGroups`` of the rows of ``x``.
    ys
        model name -> (m, d) torch tensor of the model's rows.
    dev
        torch device of the products.

    Returns
    -------
    dict
        partition -> model -> (FD_all, (k,) numpy array of per-client FDs), k the
        partition's clients.
    """
    f64 = torch.float64
    xc = x.to(device=dev, dtype=f64, copy=True)
    center = xc.mean(dim=0)
    xc -= center  # all data centred on the pool: less cancellation, the same FD
    rows = {
        p: [torch.from_numpy(g.rows(c)).to(dev) for c in range(len(g.sizes))]
        for p, g in groups.items()
    }
    # Per client (model-free): mean and trace of the covariance (ddof=1).
    stats = {p: [_mean_trace(xc[r]) for r in rs] for p, rs in rows.items()}
    pooled_stats = _mean_trace(xc)
    out = {p: {} for p in groups}
    for j, (name, y) in enumerate(ys.items()):
        y = y.to(device=dev, dtype=f64) - center
        y_c = y - y.mean(dim=0)
        model = (y.mean(dim=0), float((y_c * y_c).sum()) / (y.shape[0] - 1), y.shape[0])
        with one_thread_each():
            factor = _model_factor(y_c)
        products = xc @ factor  # (n, r <= min(m, d)), the same for every partition
        parts = [(pooled_stats, None)] + [(s, r) for p in rows for s, r in zip(stats[p], rows[p])]
        jobs = [(client, model, products, r) for client, r in parts]
        with one_thread_each() as map_:  # every client of every partition side by side
            fds = iter(map_(lambda job: _fd_value(*job), jobs))
        fd_all = next(fds)
        for p, rs in rows.items():
            out[p][name] = (fd_all, np.array([next(fds) for _ in rs]))
        log.info("FD: model %d/%d done", j + 1, len(ys))
    return out


def _model_factor(y_c: torch.Tensor) -> torch.Tensor:
    """G (d, r) with G G^T = Y~^T Y~: Y~^T itself when m <= d, else a square-root
    factor of the (d, d) scatter, so that products X G are never wider than d."""
    if y_c.shape[0] <= y_c.shape[1]:
        return y_c.T
    scatter = y_c.T @ y_c
    return sqrt_factor((scatter + scatter.T) / 2)


def _mean_trace(rows: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(mean, tr C) of float64 rows, C the covariance with ddof=1."""
    mean = rows.mean(dim=0)
    trace = sum(float(((b - mean) ** 2).sum()) for b in rows.split(_FD_BLOCK))
    return mean, trace / (rows.shape[0] - 1)


def _fd_value(client, model, products, rows) -> float:
    """FD from (mean, tr C) of the client, (mean, tr S, m) of the model (means relative
    to the same centre) and the client's rows (``None``: all) of the products X G."""
    (mu, tr_c), (m, tr_s, m_rows) = client, model
    nuclear = _root_sum(_centred_gram(products, rows))
    n_rows = products.shape[0] if rows is None else rows.shape[0]
    scale = ((n_rows - 1) * (m_rows - 1)) ** 0.5
    return float(((mu - m) ** 2).sum()) + tr_c + tr_s - 2.0 * nuclear / scale


def _centred_gram(products: torch.Tensor, rows):
    """The smaller Gram matrix of the rows' column-centred products: A A^T (rows x
    rows) when there are no more rows than columns (numpy on the CPU: :func:`_gram`),
    else A^T A summed over row blocks (no copy of all the rows); numpy on the CPU."""
    if rows is not None and rows.shape[0] <= products.shape[1]:
        a = products[rows]
        a -= a.mean(dim=0)
        return _gram(a.numpy()) if a.device.type == "cpu" else a @ a.T
    chunks = products.split(_FD_BLOCK) if rows is None else rows.split(_FD_BLOCK)
    pick = (lambda c: c) if rows is None else (lambda c: products[c])
    mean = sum(pick(c).sum(dim=0) for c in chunks) / (
        products.shape[0] if rows is None else rows.shape[0]
    )
    r = products.shape[1]
    total = torch.zeros(r, r, dtype=products.dtype, device=products.device)
    for c in chunks:
        a = pick(c) - mean
        total += a.T @ a
    return total.numpy() if total.device.type == "cpu" else total
