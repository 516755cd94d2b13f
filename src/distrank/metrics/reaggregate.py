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
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from distrank._arrays import as_features, column_mean, resolve_device, work_dtype
from distrank.clients import ClientGroups, client_groups
from distrank.metrics import kd as kd_
from distrank.metrics.fd import sqrt_factor
from distrank.metrics.kernels import (
    make_kernel,
    median_bandwidth,
    needs_bandwidth,
    sq_euclidean,
    sq_norms,
)
from distrank.metrics.options import ScoreOptions, score_options
from distrank.metrics.prdc import _check_block, _knn_sq_radii
from distrank.metrics.registry import PRDC
from distrank.metrics.scoring import _check_models
from distrank.metrics.table import COLUMNS, from_values

log = logging.getLogger(__name__)

_FD_BLOCK = 4096  # rows per step of the FD sums over many rows

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
    kd_.check_full_sample(opts.kd_estimator, why=" (full-sample sums)")
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
        from_values(values[p], g.names, g.weights(opts.weights)).assign(partition=p)
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
    for j, (name, y) in enumerate(ys.items()):
        y = y.to(device=dev, dtype=f64) - center
        y_c = y - y.mean(dim=0)
        model = (y.mean(dim=0), float((y_c * y_c).sum()) / (y.shape[0] - 1), y.shape[0])
        products = xc @ _model_factor(y_c)  # (n, r <= min(m, d)), the same for every partition
        fd_all = _fd_value(pooled_stats, model, products, None)
        for p, rs in rows.items():
            per_client = np.array([_fd_value(s, model, products, r) for s, r in zip(stats[p], rs)])
            values[p][name]["fd"] = (fd_all, per_client)
        log.info("FD: model %d/%d done", j + 1, len(ys))


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
    gram = _centred_gram(products, rows)
    vals = torch.linalg.eigvalsh((gram + gram.T) / 2)
    # Eigenvalues below r * eps * max are rounding noise of a singular Gram matrix.
    tol = gram.shape[0] * torch.finfo(vals.dtype).eps * max(float(vals[-1]), 0.0)
    nuclear = float(vals[vals > tol].sqrt().sum())
    n_rows = products.shape[0] if rows is None else rows.shape[0]
    scale = ((n_rows - 1) * (m_rows - 1)) ** 0.5
    return float(((mu - m) ** 2).sum()) + tr_c + tr_s - 2.0 * nuclear / scale


def _centred_gram(products: torch.Tensor, rows) -> torch.Tensor:
    """The smaller Gram matrix of the rows' column-centred products: A A^T (rows x
    rows) when there are no more rows than columns, else A^T A summed over row blocks
    (no copy of all the rows)."""
    if rows is not None and rows.shape[0] <= products.shape[1]:
        a = products[rows]
        a -= a.mean(dim=0)
        return a @ a.T
    chunks = products.split(_FD_BLOCK) if rows is None else rows.split(_FD_BLOCK)
    pick = (lambda c: c) if rows is None else (lambda c: products[c])
    mean = sum(pick(c).sum(dim=0) for c in chunks) / (
        products.shape[0] if rows is None else rows.shape[0]
    )
    r = products.shape[1]
    gram = torch.zeros(r, r, dtype=products.dtype, device=products.device)
    for c in chunks:
        a = pick(c) - mean
        gram += a.T @ a
    return gram


def _prdc(x, groups, ys, values, wanted, pr_k, dc_k, dt, dev):
    """PRDC of every partition from each model's distance blocks (see the module doc).

    One pass over (reference block x model block) per model; each block's hits are
    counted for the pool and for every partition at once, into per-client sums.
    """
    ref = x.to(device=dev, dtype=dt, copy=True)
    center = column_mean(ref).to(dt)
    ref -= center  # as prdc.prdc: distances unchanged, less cancellation
    block = _check_block(None, dt.itemsize)  # prdc.prdc's blocks: the same radii
    ref_sq = sq_norms(ref)
    ks = sorted(
        {pr_k for m in wanted if m == "precision"}
        | {dc_k for m in wanted if m in ("density", "coverage")}
    )
    n = ref.shape[0]
    splits = {None: _Split(torch.zeros(n, dtype=torch.int64, device=dev), 1, {})}
    if ks:
        splits[None].r2.update(_knn_sq_radii(ref, ref_sq, ks, block))
    for p, g in groups.items():
        splits[p] = _Split(torch.from_numpy(g.index).to(dev), len(g.sizes), {})
        splits[p].r2.update({k: torch.empty_like(ref_sq) for k in ks})
        for c in range(len(g.sizes)):
            r = torch.from_numpy(g.rows(c)).to(dev)
            within = _knn_sq_radii(ref[r], ref_sq[r], ks, block) if ks else {}
            for k in ks:
                splits[p].r2[k][r] = within[k]
    for name, y in ys.items():
        fake = y.to(device=dev, dtype=dt, copy=True)
        fake -= center
        counts = _prdc_counts(ref, ref_sq, fake, splits, wanted, pr_k, dc_k, block)
        pooled = counts.pop(None).values(fake.shape[0], dc_k)
        for p, c in counts.items():
            local = c.values(fake.shape[0], dc_k)
            for metric in wanted:
                values[p][name][metric] = (float(pooled[metric][0]), local[metric])


@dataclass
class _Split:
    """A split of the reference rows into clients (the pool: one client): each row's
    client ``index`` (n,), the number of clients ``k``, each row's squared k-NN radii
    within its client ``r2`` (k -> (n,))."""

    index: torch.Tensor
    k: int
    r2: dict


class _Counts:
    """Per-client hit counts of one split and one model, summed block by block in the
    float64 arithmetic of :mod:`distrank.metrics.prdc` (counts are exact)."""

    def __init__(self, split: _Split, wanted, pr_k: int, dc_k: int, m: int):
        f64, dev = torch.float64, split.index.device
        self.split, self.pr_k, self.dc_k = split, pr_k, dc_k
        self.sizes = torch.bincount(split.index, minlength=split.k).to(f64)
        self.hit = torch.zeros(split.k, m, dtype=torch.bool, device=dev)
        self.sums = {w: torch.zeros(split.k, dtype=f64, device=dev) for w in wanted}
        self.wanted = wanted

    def add_block(self, d2, rows: slice, cols: slice) -> None:
        """Precision's hits and Density's counts of the block ``d2`` (rows x cols)."""
        index, r2 = self.split.index[rows], self.split.r2
        if "precision" in self.wanted:
            inside = (d2 < r2[self.pr_k][rows].unsqueeze(1)).to(d2.dtype)
            onehot = torch.nn.functional.one_hot(index, self.split.k).T.to(d2.dtype)
            self.hit[:, cols] |= (onehot @ inside) > 0  # counts <= block rows: exact
        if "density" in self.wanted:
            inside = (d2 < r2[self.dc_k][rows].unsqueeze(1)).view(torch.uint8)
            per_row = inside.sum(dim=1, dtype=torch.int64).to(torch.float64)
            self.sums["density"].index_add_(0, index, per_row)

    def add_rows(self, rows: slice, recalled, nearest) -> None:
        """Recall's and Coverage's hits of the reference rows ``rows``, once all
        model rows are seen: ``recalled`` (in some model ball), ``nearest`` (squared
        distance to the nearest model row)."""
        index = self.split.index[rows]
        if "recall" in self.wanted:
            self.sums["recall"].index_add_(0, index, recalled.to(torch.float64))
        if "coverage" in self.wanted:
            covered = nearest < self.split.r2[self.dc_k][rows]
            self.sums["coverage"].index_add_(0, index, covered.to(torch.float64))

    def values(self, m: int, dc_k: int) -> dict[str, np.ndarray]:
        out = {}
        for metric in self.wanted:
            if metric == "precision":
                v = self.hit.sum(dim=1).to(torch.float64) / m
            elif metric == "density":
                v = (1.0 / float(dc_k)) * (self.sums[metric] / m)
            else:
                v = self.sums[metric] / self.sizes
            out[metric] = v.cpu().numpy()
        return out


def _prdc_counts(ref, ref_sq, fake, splits, wanted, pr_k, dc_k, block) -> dict:
    """:class:`_Counts` of every split for one model: blocks of ``block`` reference
    rows x ``block`` model rows, each formed once and never an n x m matrix."""
    n, m = ref.shape[0], fake.shape[0]
    fake_sq = sq_norms(fake)
    fake_r2 = _knn_sq_radii(fake, fake_sq, [pr_k], block)[pr_k] if "recall" in wanted else None
    counts = {p: _Counts(s, wanted, pr_k, dc_k, m) for p, s in splits.items()}
    for r0 in range(0, n, block):
        rows = slice(r0, min(n, r0 + block))
        recalled = torch.zeros(rows.stop - r0, dtype=torch.bool, device=ref.device)
        nearest = torch.full((rows.stop - r0,), torch.inf, dtype=ref.dtype, device=ref.device)
        for c0 in range(0, m, block):
            cols = slice(c0, min(m, c0 + block))
            d2 = sq_euclidean(ref[rows], fake[cols], ref_sq[rows], fake_sq[cols])
            if fake_r2 is not None:
                recalled |= (d2 < fake_r2[cols].unsqueeze(0)).view(torch.uint8).amax(dim=1) > 0
            torch.minimum(nearest, d2.amin(dim=1), out=nearest)
            for c in counts.values():
                c.add_block(d2, rows, cols)
        for c in counts.values():
            c.add_rows(rows, recalled, nearest)
    return counts
