"""KD in KID's subset mode for the pool, every client and every model, from shared kernel blocks.

KID (Binkowski et al., "Demystifying MMD GANs", ICLR 2018) averages the unbiased
MMD^2 over ``n_subsets`` random subsets of ``subset_size`` rows of X and of Y. With
I and J a subset's rows of X and Y, s = subset_size, and 1_I the indicator of I,

    KD_I,J = (1_I' K_XX 1_I - tr_I + 1_J' K_YY 1_J - tr_J) / (s (s-1)) - 2 1_I' K_XY 1_J / s^2

Every subset of one (model, part) pair draws from the same rows, so instead of
forming three s x s kernels per subset (as the peers do), the kernel blocks of the
part's rows are formed once and every subset's sums come from the block times the
(rows x n_subsets) membership matrix P: the column sums of P_a * (K_ab P_b) over
row blocks a and b are all the subsets' 1_I' K 1_I at once, a GEMM. The clients are
row ranges of the pooled reference sorted by client, so one set of pooled blocks
serves the pool and every client; K_YY serves every part; only blocks on or above
the diagonal of K_XX and K_YY are formed. Memory: one block x block kernel block
and the membership matrices (rows x n_subsets per part), never an n x n matrix.

The draws are those of torch-fidelity's ``kid_features_to_metric(Y, X_part,
rng_seed=seed)``: a fresh ``numpy.random.RandomState(seed)`` per (model, part) pair,
rows of Y then of X for each subset, without replacement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from distrank._arrays import column_mean, product_rows, resolve_device, work_dtype
from distrank.metrics._kernels import Kernel

ACC = torch.float64
COLUMNS = 2048  # membership columns per product in K_YY (bounds the block x columns buffer)


def subset_draws(n: int, m: int, n_subsets: int, size: int, seed: int):
    """(rows of X, rows of Y) of every subset, each (n_subsets, size), as KID draws them."""
    rng = np.random.RandomState(seed)
    ix = np.empty((n_subsets, size), dtype=np.int64)
    iy = np.empty((n_subsets, size), dtype=np.int64)
    for i in range(n_subsets):
        iy[i] = rng.choice(m, size, replace=False)
        ix[i] = rng.choice(n, size, replace=False)
    return ix, iy


@dataclass
class _Parts:
    """The pool (part 0) and each client as row ranges of the reference sorted by client."""

    x: torch.Tensor  # (n, d) sorted by client, centred for a translation-invariant kernel
    center: torch.Tensor | None
    starts: np.ndarray  # (P,) first sorted row of each part
    ends: np.ndarray  # (P,)
    rows: list[np.ndarray]  # each part's rows, in sorted positions, in the part's own order

    def overlap(self, p: int, lo: int, hi: int) -> tuple[int, int]:
        """The rows of part p in [lo, hi), as a (possibly empty) range."""
        return max(lo, int(self.starts[p])), min(hi, int(self.ends[p]))


def _parts(x, client_index, kernel) -> _Parts:
    """Sort the reference by client; with ``client_index`` None the pool is the only part."""
    n = x.shape[0]
    index = np.zeros(n, dtype=np.int64) if client_index is None else np.asarray(client_index)
    order = np.argsort(index, kind="stable")
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(index))])
    starts, ends = [0], [n]
    rows = [position]  # the pool's draws index the original row order
    if client_index is not None:
        starts += list(bounds[:-1])
        ends += list(bounds[1:])
        rows += [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    x = x[torch.from_numpy(order).to(x.device)]
    center = column_mean(x).to(x.dtype) if kernel.translation_invariant else None
    if center is not None:
        x = x - center
    return _Parts(x, center, np.asarray(starts), np.asarray(ends), rows)


def _membership(rows: int, draws: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """(rows, n_subsets) 0/1 matrix: column i marks the rows of subset i (``draws[i]``)."""
    out = torch.zeros(rows, draws.shape[0], dtype=like.dtype, device=like.device)
    index = torch.from_numpy(np.ascontiguousarray(draws.T)).to(like.device)
    return out.scatter_(0, index, 1.0)


def _sandwich(pa: torch.Tensor, k: torch.Tensor, pb: torch.Tensor) -> torch.Tensor:
    """diag(pa' k pb) in float64: each subset's sum of the block's entries."""
    return (pa.to(ACC) * (k @ pb).to(ACC)).sum(dim=0)


def _within_sums(x, parts: _Parts, members: Sequence[torch.Tensor], kernel, block):
    """Per part, each column's 1_I' K 1_I - tr_I over the part's rows of ``x``.

    ``members[p]`` is part p's (rows of part p, columns) membership matrix, rows in
    the order of ``x[starts[p]:ends[p]]``.
    """
    n = x.shape[0]
    out = [torch.zeros(mp.shape[1], dtype=ACC, device=x.device) for mp in members]
    for a0 in range(0, n, block):
        a1 = min(a0 + block, n)
        for b0 in range(a0, n, block):
            b1 = min(b0 + block, n)
            kab = kernel(x[a0:a1], x[b0:b1])
            for p, mp in enumerate(members):
                out[p] += _block_within(kab, parts, p, mp, (a0, a1, b0, b1))
    return out


def _block_within(kab, parts: _Parts, p: int, mp, box) -> torch.Tensor | int:
    """Part p's share of one kernel block (rows a0:a1, columns b0:b1) of K_XX."""
    a0, a1, b0, b1 = box
    r0, r1 = parts.overlap(p, a0, a1)
    c0, c1 = parts.overlap(p, b0, b1)
    if r0 >= r1 or c0 >= c1:
        return 0
    start = int(parts.starts[p])
    pa, pb = mp[r0 - start : r1 - start], mp[c0 - start : c1 - start]
    total = _sandwich(pa, kab[r0 - a0 : r1 - a0, c0 - b0 : c1 - b0], pb)
    if a0 != b0:  # the mirrored block (b, a) adds the same
        return 2 * total
    diagonal = torch.diagonal(kab)[r0 - a0 : r1 - a0].to(ACC)
    return total - diagonal @ pa.to(ACC)


def _symmetric_within(y, member, kernel, block):
    """Each column's 1_J' K_YY 1_J - tr_J over all rows of ``y``, columns in chunks."""
    m = y.shape[0]
    out = torch.zeros(member.shape[1], dtype=ACC, device=y.device)
    for a0 in range(0, m, block):
        for b0 in range(a0, m, block):
            kab = kernel(y[a0 : a0 + block], y[b0 : b0 + block])
            for c0 in range(0, member.shape[1], COLUMNS):
                pa = member[a0 : a0 + block, c0 : c0 + COLUMNS]
                pb = member[b0 : b0 + block, c0 : c0 + COLUMNS]
                total = _sandwich(pa, kab, pb)
                if a0 != b0:
                    total = 2 * total
                else:
                    total = total - torch.diagonal(kab).to(ACC) @ pa.to(ACC)
                out[c0 : c0 + COLUMNS] += total
    return out


def _cross_sums(parts: _Parts, members, y, y_members, kernel, block):
    """Per part p, each subset's 1_I' K_XY 1_J (``members[p]`` and ``y_members[p]``)."""
    x, n, m = parts.x, parts.x.shape[0], y.shape[0]
    out = [torch.zeros(mp.shape[1], dtype=ACC, device=x.device) for mp in members]
    for a0 in range(0, n, block):
        a1 = min(a0 + block, n)
        for b0 in range(0, m, block):
            kab = kernel(x[a0:a1], y[b0 : b0 + block])
            for p, mp in enumerate(members):
                r0, r1 = parts.overlap(p, a0, a1)
                if r0 < r1:
                    start = int(parts.starts[p])
                    pb = y_members[p][b0 : b0 + block]
                    out[p] += _sandwich(mp[r0 - start : r1 - start], kab[r0 - a0 : r1 - a0], pb)
    return out


def subset_values(
    x: torch.Tensor,
    client_index: np.ndarray | None,
    models: Sequence[torch.Tensor],
    kernel: Kernel,
    *,
    n_subsets: int,
    subset_size: int,
    seed: int,
    block_size: int,
) -> np.ndarray:
    """KD of every subset, (models, parts, n_subsets), part 0 the pool, then each client.

    ``x`` (n, d) and each model (m, d) are tensors in the working dtype and device;
    ``client_index`` (n,) holds each row's client in 0..k-1 (None: the pool only).
    Client c's subsets index its rows in reference order, as ``x[client_index == c]``.
    Every part and model must hold at least ``subset_size`` rows (checked by the caller).
    """
    parts = _parts(x, client_index, kernel)
    sizes = [len(rows) for rows in parts.rows]
    widths = sorted({int(y.shape[0]) for y in models})  # the X draws depend on (n_p, m)
    draws = {
        (p, m): subset_draws(n, m, n_subsets, subset_size, seed)
        for p, n in enumerate(sizes)
        for m in widths
    }
    members = [
        torch.cat(
            [
                _membership(sizes[p], parts.rows[p][draws[p, m][0]] - parts.starts[p], x)
                for m in widths
            ],
            dim=1,
        )
        for p in range(len(sizes))
    ]
    xx = _within_sums(parts.x, parts, members, kernel, block_size)
    s = subset_size
    out = np.empty((len(models), len(sizes), n_subsets))
    for g, y in enumerate(models):
        u = widths.index(int(y.shape[0]))
        cols = slice(u * n_subsets, (u + 1) * n_subsets)
        y = y if parts.center is None else y - parts.center
        y_members = [_membership(y.shape[0], draws[p, y.shape[0]][1], y) for p in range(len(sizes))]
        yy = _symmetric_within(y, torch.cat(y_members, dim=1), kernel, block_size)
        xy = _cross_sums(parts, [mp[:, cols] for mp in members], y, y_members, kernel, block_size)
        for p in range(len(sizes)):
            within = xx[p][cols] + yy[p * n_subsets : (p + 1) * n_subsets]
            out[g, p] = (within / (s * (s - 1)) - 2 * xy[p] / (s * s)).cpu().numpy()
    return out


def subset_kd(
    reference,
    client_index: np.ndarray | None,
    models: Sequence,
    kernel: Kernel,
    *,
    n_subsets: int = 100,
    subset_size: int = 1000,
    seed: int = 0,
    dtype: str = "float32",
    device=None,
    block_size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std (ddof=0) of KD over the subsets, each (models, 1 + clients).

    Column 0 is the pooled reference, column 1 + c client c (each subset's KD:
    ``subset_values``); kernel blocks are formed in ``dtype`` on ``device``, subset sums
    kept in float64. The draws are KID's (module doc): a fresh
    ``numpy.random.RandomState(seed)`` per (model, part) pair; client c's subsets index
    its rows in reference order, as ``reference[client_index == c]``.

    Parameters
    ----------
    reference
        (n, d) numpy or torch array of the pooled reference rows.
    client_index
        (n,) int array: each row's client, in 0..k-1 (None: the pool only, one column).
    models
        sequence of (m, d) numpy or torch arrays, the models' rows.
    kernel
        KD's kernel, every parameter fixed (``make_kernel``).
    n_subsets
        random subsets per (model, part) pair (default 100).
    subset_size
        rows of X and of Y in each subset (default 1000); the pool, every client and
        every model must hold at least this many (checked by the caller).
    seed
        of each pair's ``RandomState`` (default 0).
    dtype
        ``"float32"`` (default) or ``"float64"``: of the rows and the kernel blocks.
    device
        torch device (``None``: CUDA if available, else CPU).
    block_size
        rows of one product block (``None``: 64 MiB blocks, 4096 rows in float32, 2816
        in float64).

    Returns
    -------
    tuple of numpy.ndarray
        (mean, std), each (models, 1 + k) float64: column 0 the pool, 1 + c client c.
    """
    dev, dt = resolve_device(device), work_dtype(dtype)
    x = torch.as_tensor(reference).to(device=dev, dtype=dt)
    ys = [torch.as_tensor(y).to(device=dev, dtype=dt) for y in models]
    values = subset_values(
        x,
        client_index,
        ys,
        kernel,
        n_subsets=n_subsets,
        subset_size=subset_size,
        seed=seed,
        block_size=product_rows(block_size, dt.itemsize),
    )
    return values.mean(axis=2), values.std(axis=2)
