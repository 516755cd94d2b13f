"""Precision, Recall, Density and Coverage of many partitions of one reference.

The squared distances between reference and generated rows, the models' k-NN radii,
Recall's hits and each reference row's nearest generated row are the same for every
partition (the definitions are in :mod:`distrank.metrics.prdc`); a partition only
changes the reference radii (k-NN within each client) and which rows count together.
The values equal those of :func:`distrank.metrics.prdc.prdc` on each partition afresh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from distrank._arrays import column_mean, product_rows
from distrank.metrics._kernels import sq_euclidean, sq_norms
from distrank.metrics.prdc._scores import _knn_sq_radii

__all__ = ["partition_prdc"]


def partition_prdc(x, groups: Mapping, ys: Mapping, wanted, pr_k, dc_k, dt, dev) -> dict:
    """PRDC of every model against the pool and every client of every partition.

    One pass over (reference block x model block) per model; each block's hits are
    counted for the pool and for every partition at once, into per-client sums.

    Parameters
    ----------
    x
        (n, d) torch tensor of the pooled reference rows.
    groups
        partition name -> ``distrank.clients.ClientGroups`` of the rows of ``x``.
    ys
        model name -> (m, d) torch tensor of the model's rows.
    wanted
        the metrics, among ``"precision"``, ``"recall"``, ``"density"`` and
        ``"coverage"``.
    pr_k
        k of the k-NN radii of Precision (the reference's) and Recall (the model's).
    dc_k
        k of the reference's k-NN radii of Density and Coverage.
    dt
        torch dtype of the distance blocks.
    dev
        torch device of the products.

    Returns
    -------
    dict
        partition -> model -> metric -> (pooled value, (k,) numpy array of per-client
        values), k the partition's clients.
    """
    ref = x.to(device=dev, dtype=dt, copy=True)
    center = column_mean(ref).to(dt)
    ref -= center  # as prdc.prdc: distances unchanged, less cancellation
    block = product_rows(None, dt.itemsize)  # prdc.prdc's blocks: the same radii
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
    out = {p: {} for p in groups}
    for name, y in ys.items():
        fake = y.to(device=dev, dtype=dt, copy=True)
        fake -= center
        counts = _prdc_counts(ref, ref_sq, fake, splits, wanted, pr_k, dc_k, block)
        pooled = counts.pop(None).values(fake.shape[0], dc_k)
        for p, c in counts.items():
            local = c.values(fake.shape[0], dc_k)
            out[p][name] = {m: (float(pooled[m][0]), local[m]) for m in wanted}
    return out


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
