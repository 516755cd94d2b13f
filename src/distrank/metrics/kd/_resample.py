r"""KD of bootstrap resamples by re-weighting: every kernel block formed once and
contracted with all B resamples' row counts (the module doc of
``distrank.metrics._bootstrap`` derives the U and V forms).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from distrank._arrays import column_mean, product_rows, resolve_device, work_dtype
from distrank.metrics._kernels import Kernel
from distrank.metrics._metric import check_full_sample
from distrank.metrics.kd._sums import KernelSums

__all__ = ["resampled_kernel_sums", "row_counts"]


def resampled_kernel_sums(
    reference,
    client_index,
    models: Sequence,
    kernel: Kernel,
    reference_counts,
    model_counts: Sequence,
    *,
    estimator: str,
    dtype: str = "float32",
    device=None,
    block_size: int | None = None,
) -> list[KernelSums]:
    """Kernel sums whose ``kd(estimator)`` is each resample's KD (module doc), for B
    resamples given by row counts.

    ``reference`` (n, d), ``client_index`` (n,) in 0..k-1 and ``models`` ((m_g, d)
    arrays) are those of ``kd._sums.kernel_sums``; ``reference_counts`` is (B, n), the
    times each reference row is drawn in each resample (summing to n_i over client
    i's rows), and ``model_counts[g]`` is (B, m_g). Blocks of ``block_size`` rows are
    formed in ``dtype``; the forms are accumulated in float64.
    """
    check_full_sample(estimator)
    dev, dt = resolve_device(device), work_dtype(dtype)
    block_size = product_rows(block_size, dt.itemsize)
    x = torch.as_tensor(reference).to(device=dev, dtype=dt)
    center = column_mean(x).to(dt) if kernel.translation_invariant else None
    if center is not None:  # less cancellation, the same kernel values
        x = x - center
    index = np.asarray(client_index)
    k = int(index.max()) + 1
    sizes = np.bincount(index, minlength=k).astype(np.int64)
    w = torch.as_tensor(np.asarray(reference_counts), dtype=dt, device=dev)
    rows = [torch.from_numpy(np.flatnonzero(index == c)).to(dev) for c in range(k)]
    xs, ws = [x[r] for r in rows], [w[:, r] for r in rows]
    sums = _SelfSums(kernel, block_size, estimator == "unbiased")
    xx, xx_diag = _client_sums(xs, ws, sums)
    xy, yy, yy_diag, model_sizes = [], [], [], []
    for y, v in zip(models, model_counts):
        y = torch.as_tensor(y).to(device=dev, dtype=dt)
        if center is not None:
            y = y - center
        v = torch.as_tensor(np.asarray(v), dtype=dt, device=dev)
        xy.append(
            torch.stack(
                [_weighted_cross_sums(xs[a], ws[a], y, v, kernel, block_size) for a in range(k)],
                dim=1,
            )
        )
        total, trace = sums(y, v)
        yy.append(total)
        yy_diag.append(trace)
        model_sizes.append(y.shape[0])
    xx, xx_diag = xx.cpu().numpy(), xx_diag.cpu().numpy()
    xy = torch.stack(xy, dim=1).cpu().numpy()  # (B, M, k)
    yy, yy_diag = torch.stack(yy, dim=1).cpu().numpy(), torch.stack(yy_diag, dim=1).cpu().numpy()
    model_sizes = np.asarray(model_sizes, dtype=np.int64)
    return [
        KernelSums(
            client_sizes=sizes,
            model_sizes=model_sizes,
            xx=xx[b],
            xx_diag=xx_diag[b],
            xy=xy[b],
            yy=yy[b],
            yy_diag=yy_diag[b],
        )
        for b in range(w.shape[0])
    ]


@dataclass(frozen=True)
class _SelfSums:
    """(within-sample sum, its trace) of each resample as ``KernelSums.kd(estimator)``
    needs them: the V form as drawn, or the U form (module doc)."""

    kernel: Kernel
    block_size: int
    unbiased: bool

    def __call__(self, z, counts):
        total, trace, copies = _weighted_self_sums(z, counts, self.kernel, self.block_size)
        if not self.unbiased:
            return total, trace
        size = z.shape[0]
        return (total - copies) * (size / (size - 1)), torch.zeros_like(trace)


def _client_sums(xs, ws, sums: _SelfSums) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, k, k) sums between clients' resampled rows and (B, k) their traces."""
    k, n_resamples, dev = len(xs), ws[0].shape[0], xs[0].device
    xx = torch.zeros(n_resamples, k, k, dtype=torch.float64, device=dev)
    xx_diag = torch.zeros(n_resamples, k, dtype=torch.float64, device=dev)
    for a in range(k):
        xx[:, a, a], xx_diag[:, a] = sums(xs[a], ws[a])
        for b in range(a + 1, k):
            xx[:, a, b] = _weighted_cross_sums(
                xs[a], ws[a], xs[b], ws[b], sums.kernel, sums.block_size
            )
            xx[:, b, a] = xx[:, a, b]
    return xx, xx_diag


def _weighted_self_sums(x, w, kernel, block):
    """For each row of w (B, n): sum_{r,s} w_r w_s k(x_r, x_s), sum_r w_r k(x_r, x_r) and
    sum_r w_r^2 k(x_r, x_r) (the pairs of copies of one row)."""
    acc = torch.float64
    total = torch.zeros(w.shape[0], dtype=acc, device=x.device)
    trace = torch.zeros(w.shape[0], dtype=acc, device=x.device)
    copies = torch.zeros(w.shape[0], dtype=acc, device=x.device)
    for a0 in range(0, x.shape[0], block):
        xa, wa = x[a0 : a0 + block], w[:, a0 : a0 + block]
        for b0 in range(a0, x.shape[0], block):
            kab = kernel(xa, x[b0 : b0 + block])
            form = ((wa @ kab) * w[:, b0 : b0 + block]).sum(dim=1, dtype=acc)
            if b0 == a0:
                total += form
                diagonal = torch.diagonal(kab)
                trace += (wa * diagonal).sum(dim=1, dtype=acc)
                copies += (wa * wa * diagonal).sum(dim=1, dtype=acc)
            else:  # the mirrored block (b, a) gives the same form
                total += 2 * form
    return total, trace, copies


def _weighted_cross_sums(x, w, y, v, kernel, block):
    """sum_{r,j} w_r v_j k(x_r, y_j) for each resample (rows of w (B, n) and v (B, m))."""
    total = torch.zeros(w.shape[0], dtype=torch.float64, device=x.device)
    for a0 in range(0, x.shape[0], block):
        xa, wa = x[a0 : a0 + block], w[:, a0 : a0 + block]
        for c0 in range(0, y.shape[0], block):
            kac = kernel(xa, y[c0 : c0 + block])
            total += ((wa @ kac) * v[:, c0 : c0 + block]).sum(dim=1, dtype=torch.float64)
    return total


def row_counts(indices: np.ndarray, n: int) -> np.ndarray:
    """(B, n) counts of each row in each resample, from (B, n_drawn) drawn indices."""
    indices = np.asarray(indices)
    offsets = indices + n * np.arange(indices.shape[0])[:, None]
    return np.bincount(offsets.ravel(), minlength=indices.shape[0] * n).reshape(-1, n)
