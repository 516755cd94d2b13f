r"""Score one reference pool under many partitions: what no partition changes, computed once.

A heterogeneity sweep (E8) scores the same models against the same reference rows
split into clients in many ways. Most of the work does not depend on the split:

- **KD.** With a *fine* client index of which every partition is a coarsening (here:
  the common refinement of all the partitions), the kernel sums of
  :func:`distrank.metrics.kd.kernel_sums` of a partition are sums of the fine ones. With
  :math:`A` the (fine groups x clients) 0/1 assignment,

  .. math::
      S_{X_a X_b} = (A^\top S^\mathrm{fine}_{XX} A)_{ab}, \qquad
      S_{X_i Y} = (S^\mathrm{fine}_{XY} A)_{i}, \qquad
      \mathrm{tr}_{X_i} = (A^\top \mathrm{tr}^\mathrm{fine})_i,

  and :meth:`~distrank.metrics.kd.KernelSums.kd` turns them into KD, exactly as
  :func:`distrank.metrics.score` does.
- **FD.** For client rows :math:`X_i` (mean :math:`\mu_i`, covariance :math:`C_i`) and a
  model :math:`Y` (mean :math:`m`, covariance :math:`S`), with centred rows
  :math:`\tilde X_i`, :math:`\tilde Y`, the eigenvalues of :math:`C_i^{1/2} S C_i^{1/2}`
  are the squared singular values of :math:`\tilde X_i \tilde Y^\top / \sqrt{(n_i-1)(m-1)}`,
  so (Dowson & Landau, 1982)

  .. math::
      \mathrm{FD}_i = \lVert \mu_i - m \rVert^2 + \mathrm{tr}\, C_i + \mathrm{tr}\, S
      - \frac{2 \lVert \tilde X_i \tilde Y^\top \rVert_*}{\sqrt{(n_i - 1)(m - 1)}},

  and :math:`\tilde X_i \tilde Y^\top` is the row block of :math:`P = X \tilde Y^\top`
  (one product per model, no partition in it) minus its column means. The nuclear norm
  is the sum of the square roots of the eigenvalues of the smaller Gram matrix.
- **PRDC.** The squared distances between reference and generated rows, the models'
  k-NN radii, Recall's hits and each reference row's nearest generated row are the
  same for every partition (the definitions are in :mod:`distrank.metrics.prdc`); a
  partition only changes the reference radii (k-NN within each client) and which rows
  count together.

The values equal those of :func:`distrank.metrics.score` on each partition afresh (KD
and FD to rounding, PRDC exactly); the test suite checks this.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch

from distrank._arrays import as_features, resolve_device, work_dtype
from distrank.clients import ClientGroups, client_groups
from distrank.metrics import kd as kd_
from distrank.metrics.kernels import make_kernel, median_bandwidth, needs_bandwidth, sq_euclidean
from distrank.metrics.options import ScoreOptions, score_options
from distrank.metrics.prdc import _check_block, _knn_sq_radii, _sq_norms
from distrank.metrics.registry import PRDC
from distrank.metrics.scoring import _check_models, _table
from distrank.metrics.table import COLUMNS

log = logging.getLogger(__name__)

__all__ = ["coarsen", "common_refinement", "score_partitions"]


def common_refinement(partitions: Sequence[np.ndarray]) -> np.ndarray:
    """Fine group of each row: two rows share a group iff every partition puts them
    in the same client. ``partitions`` are (n,) client index arrays; returns (n,) int64
    in 0..B-1, every partition being a coarsening of it."""
    stacked = np.stack([np.asarray(p) for p in partitions], axis=1)
    _, fine = np.unique(stacked, axis=0, return_inverse=True)
    return fine.reshape(-1).astype(np.int64)


def coarsen(sums: kd_.KernelSums, fine_to_client: np.ndarray) -> kd_.KernelSums:
    """The kernel sums of the partition that gives fine group g to client ``fine_to_client[g]``.

    ``fine_to_client`` is (B,) int in 0..k-1, every client holding at least one group.
    """
    assign = np.asarray(fine_to_client)
    if assign.shape != sums.client_sizes.shape:
        raise ValueError(
            f"fine_to_client: expected {sums.client_sizes.shape[0]} entries (one "
            f"per fine group), got shape {assign.shape}"
        )
    k = int(assign.max()) + 1
    a = np.zeros((assign.size, k))
    a[np.arange(assign.size), assign] = 1.0
    if (a.sum(axis=0) == 0).any():
        raise ValueError("fine_to_client: some client holds no fine group")
    return kd_.KernelSums(
        client_sizes=(sums.client_sizes @ a).round().astype(np.int64),
        model_sizes=sums.model_sizes,
        xx=a.T @ sums.xx @ a,
        xx_diag=sums.xx_diag @ a,
        xy=sums.xy @ a,
        yy=sums.yy,
        yy_diag=sums.yy_diag,
    )


def score_partitions(
    reference,
    partitions: Mapping[str, object],
    models: Mapping[str, object],
    options: ScoreOptions | Mapping | None = None,
    *,
    device=None,
    block_size: int = kd_.BLOCK_SIZE,
    **changes,
) -> pd.DataFrame:
    """:func:`distrank.metrics.score` of every partition, sharing the partition-free work.

    Args:
        reference: (n, d) reference features.
        partitions: partition name -> (n,) client label (int or str) of each row.
        models: model name -> (m, d) generated features.
        options, changes, device, block_size: as in :func:`distrank.metrics.score`;
            ``kd_estimator`` is ``"unbiased"`` or ``"biased"`` (random subsets have no
            partition-free sums).

    Returns:
        The tables of :func:`distrank.metrics.score`, one per partition, stacked with a
        first column ``partition``.

    Cost: the kernel sums are formed once for the common refinement of the partitions
    (B fine groups; B x B sums), so block-aligned partitions keep B small. Memory holds
    one model's (n, m) products at a time.
    """
    opts = score_options(options, **changes)
    wanted = opts.metrics
    if opts.kd_estimator not in ("unbiased", "biased"):
        raise ValueError(
            f"kd_estimator: expected 'unbiased' or 'biased' (full-sample sums), "
            f"got {opts.kd_estimator!r}"
        )
    pr_k, dc_k = opts.pr_k, opts.dc_k
    dt, dev = work_dtype(opts.dtype), resolve_device(device)
    x = as_features(reference, "reference")
    n = x.shape[0]
    ys = _check_models(models, x.shape[1])
    if not isinstance(partitions, Mapping) or not partitions:
        raise ValueError("partitions: expected a non-empty mapping of name -> (n,) labels")
    groups = {}
    for name, labels in partitions.items():
        try:
            groups[str(name)] = client_groups(labels, n)
        except ValueError as err:
            raise ValueError(f"partitions[{name!r}]: {err}") from None
    _check_sizes(groups, ys, wanted, pr_k, dc_k)

    values = {p: {g: {} for g in ys} for p in groups}
    if "kd" in wanted:
        _kd(x, groups, ys, values, opts, dev, block_size)
    if "fd" in wanted:
        _fd(x, groups, ys, values, dev)
    if set(wanted) & set(PRDC):
        _prdc(x, groups, ys, values, [m for m in wanted if m in PRDC], pr_k, dc_k, dt, dev)
    tables = [
        _table(values[p], g.names, g.weights(opts.weights)).assign(partition=p)
        for p, g in groups.items()
    ]
    return pd.concat(tables, ignore_index=True)[["partition", *COLUMNS]]


def _check_sizes(groups: Mapping[str, ClientGroups], ys, wanted, pr_k, dc_k) -> None:
    """The size rules of :func:`distrank.metrics.score`, for every partition up front."""
    need = {"kd": 2, "fd": 2, "precision": pr_k + 1, "density": dc_k + 1, "coverage": dc_k + 1}
    client_need = max([need[m] for m in wanted if m in need], default=1)
    for p, g in groups.items():
        for label, size in zip(g.names, g.sizes):
            if size < client_need:
                raise ValueError(
                    f"partitions[{p!r}]: client {label!r} has {size} rows; "
                    f"{', '.join(wanted)} need at least {client_need}"
                )
    model_need = max(
        [2 for m in wanted if m in ("kd", "fd")] + [pr_k + 1 for m in wanted if m == "recall"],
        default=1,
    )
    for name, y in ys.items():
        if y.shape[0] < model_need:
            raise ValueError(
                f"models[{name!r}] has {y.shape[0]} rows; {', '.join(wanted)} "
                f"need at least {model_need}"
            )


def _kd(x, groups, ys, values, opts: ScoreOptions, dev, block):
    kernel, kernel_params, dtype = opts.kernel, opts.kernel_params, opts.dtype
    if needs_bandwidth(kernel, kernel_params):  # as the scorer: once, on the pooled reference
        kernel_params = {
            **(kernel_params or {}),
            "bandwidth": median_bandwidth(x, kernel=kernel, seed=opts.seed),
        }
    kern = make_kernel(kernel, kernel_params, x.shape[1])
    fine = common_refinement([g.index for g in groups.values()])
    log.info(
        "KD: kernel sums over %d fine groups, shared by %d partitions",
        int(fine.max()) + 1,
        len(groups),
    )
    sums = kd_.kernel_sums(x, fine, ys.values(), kern, dtype=dtype, device=dev, block_size=block)
    first_row = np.unique(fine, return_index=True)[1]
    for p, g in groups.items():
        per_client, pooled = coarsen(sums, g.index[first_row]).kd(opts.kd_estimator)
        for j, name in enumerate(ys):
            values[p][name]["kd"] = (float(pooled[j]), per_client[j])


def _fd(x, groups, ys, values, dev):
    f64 = torch.float64
    xc = x.to(device=dev, dtype=f64)
    center = xc.mean(dim=0)
    xc = xc - center  # all data centred on the pool: less cancellation, the same FD
    rows = {
        p: [torch.from_numpy(g.rows(c)).to(dev) for c in range(len(g.sizes))]
        for p, g in groups.items()
    }
    pool = torch.arange(xc.shape[0], device=dev)
    # Per client (model-free): mean and trace of the covariance (ddof=1).
    stats = {p: [_mean_trace(xc[r]) for r in rs] for p, rs in rows.items()}
    pooled_stats = _mean_trace(xc)
    for j, (name, y) in enumerate(ys.items()):
        y = y.to(device=dev, dtype=f64) - center
        y_c = y - y.mean(dim=0)
        model = (y.mean(dim=0), float((y_c * y_c).sum()) / (y.shape[0] - 1))
        products = xc @ y_c.T  # (n, m): P = X Y~^T, the same for every partition
        fd_all = _fd_value(pooled_stats, model, products, pool)
        for p, rs in rows.items():
            per_client = np.array([_fd_value(s, model, products, r) for s, r in zip(stats[p], rs)])
            values[p][name]["fd"] = (fd_all, per_client)
        log.info("FD: model %d/%d done", j + 1, len(ys))


def _mean_trace(rows: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(mean, tr C) of float64 rows, C the covariance with ddof=1."""
    mean = rows.mean(dim=0)
    centred = rows - mean
    return mean, float((centred * centred).sum()) / (rows.shape[0] - 1)


def _fd_value(client, model, products, rows) -> float:
    """FD from (mean, tr C) of the client and of the model (means relative to the same
    centre) and the client's rows of the products P (module doc)."""
    (mu, tr_c), (m, tr_s) = client, model
    a = products[rows]
    a = a - a.mean(dim=0)
    gram = a @ a.T if a.shape[0] <= a.shape[1] else a.T @ a
    vals = torch.linalg.eigvalsh((gram + gram.T) / 2)
    # Eigenvalues below r * eps * max are rounding noise of a singular Gram matrix.
    tol = gram.shape[0] * torch.finfo(vals.dtype).eps * max(float(vals[-1]), 0.0)
    nuclear = float(vals[vals > tol].sqrt().sum())
    scale = ((rows.shape[0] - 1) * (products.shape[1] - 1)) ** 0.5
    return float(((mu - m) ** 2).sum()) + tr_c + tr_s - 2.0 * nuclear / scale


def _prdc(x, groups, ys, values, wanted, pr_k, dc_k, dt, dev):
    """PRDC of every partition from each model's distance block (see the module doc)."""
    ref = x.to(device=dev, dtype=dt)
    center = ref.mean(dim=0, dtype=torch.float64).to(dt)
    ref = ref - center  # as prdc.prdc: distances unchanged, less cancellation
    block = _check_block(None, dt.itemsize)  # prdc.prdc's blocks: the same radii
    ref_sq = _sq_norms(ref, block)
    ks = sorted(
        {pr_k for m in wanted if m == "precision"}
        | {dc_k for m in wanted if m in ("density", "coverage")}
    )
    pooled = _knn_sq_radii(ref, ref_sq, ks, block) if ks else {}
    radii = {}  # partition -> k -> (n,) squared radius of each row within its client
    onehot = {}  # partition -> (k, n) client membership, in the distance dtype
    for p, g in groups.items():
        radii[p] = {k: torch.empty_like(ref_sq) for k in ks}
        for c in range(len(g.sizes)):
            r = torch.from_numpy(g.rows(c)).to(dev)
            within = _knn_sq_radii(ref[r], ref_sq[r], ks, block) if ks else {}
            for k in ks:
                radii[p][k][r] = within[k]
        index = torch.from_numpy(g.index).to(dev)
        onehot[p] = torch.nn.functional.one_hot(index, len(g.sizes)).T.to(torch.float64)

    for name, y in ys.items():
        fake = y.to(device=dev, dtype=dt) - center
        fake_sq = _sq_norms(fake, block)
        d2 = sq_euclidean(ref, fake, ref_sq, fake_sq)  # (n, m), no partition in it
        m = fake.shape[0]
        shared = {}
        if "recall" in wanted:
            fake_r2 = _knn_sq_radii(fake, fake_sq, [pr_k], block)[pr_k]
            shared["recall"] = (d2 < fake_r2[None, :]).any(dim=1).to(torch.float64)
        if "coverage" in wanted:
            shared["nearest"] = d2.amin(dim=1)
        pooled_values = _prdc_values(d2, shared, pooled, None, wanted, pr_k, dc_k, m)
        for p in groups:
            local = _prdc_values(d2, shared, radii[p], onehot[p], wanted, pr_k, dc_k, m)
            for metric in wanted:
                values[p][name][metric] = (pooled_values[metric][0], local[metric])


def _prdc_values(d2, shared, r2, onehot, wanted, pr_k, dc_k, m) -> dict[str, np.ndarray]:
    """Per client (rows of ``onehot``; ``None``: the pool) value of each metric, in the
    float64 arithmetic of :mod:`distrank.metrics.prdc` (counts are exact in float64)."""
    f64 = torch.float64
    if onehot is None:
        onehot = torch.ones(1, d2.shape[0], dtype=f64, device=d2.device)
    sizes = onehot.sum(dim=1)
    out = {}
    if "precision" in wanted:
        inside = (d2 < r2[pr_k][:, None]).to(f64)
        hit = (onehot @ inside) > 0  # (clients, m): some ball of the client holds the row
        out["precision"] = hit.sum(dim=1).to(f64) / m
    if "recall" in wanted:
        out["recall"] = (onehot @ shared["recall"]) / sizes
    if "density" in wanted:
        counts = (d2 < r2[dc_k][:, None]).sum(dim=1).to(f64)
        out["density"] = (1.0 / float(dc_k)) * ((onehot @ counts) / m)
    if "coverage" in wanted:
        out["coverage"] = (onehot @ (shared["nearest"] < r2[dc_k]).to(f64)) / sizes
    return {metric: v.cpu().numpy() for metric, v in out.items()}
