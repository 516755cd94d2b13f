"""Precision, Recall, Density and Coverage of generated samples, per client and pooled.

Given reference (real) features ``X`` (n rows) and generated features ``Y`` (m rows),
let ``r_k(x)`` be the Euclidean distance from ``x`` to its k-th nearest neighbour in
its own set, the point itself excluded, and ``B(x, r)`` the open ball (strict ``<``)::

    Precision = 1/m       sum_j [ exists i: Y_j in B(X_i, r_k(X_i)) ]    (k = pr_k)
    Recall    = 1/n       sum_i [ exists j: X_i in B(Y_j, r_k(Y_j)) ]    (k = pr_k)
    Density   = 1/(k m)   sum_j sum_i [ Y_j in B(X_i, r_k(X_i)) ]        (k = dc_k)
    Coverage  = 1/n       sum_i [ min_j |X_i - Y_j| < r_k(X_i) ]         (k = dc_k)

Precision and Recall follow Kynkaanniemi et al., "Improved Precision and Recall
Metric for Assessing Generative Models" (NeurIPS 2019); Density and Coverage follow
Naeem et al., "Reliable Fidelity and Diversity Metrics for Generative Models"
(ICML 2020). The values equal those of the ``prdc`` package by Naeem et al.
(``prdc.compute_prdc(real, fake, nearest_k)``), which uses one k for all four.

A client's value uses that client's rows alone as ``X``, with radii ``r_k`` found
among the client's rows. Recall only uses the radii of ``Y``, which do not depend on
the clients, so with lambda_i = n_i / n

    Recall_all = sum_i lambda_i Recall_i        (exactly)

whereas Precision, Density and Coverage have no such identity (Wang et al.,
"Consistent Distributed Ranking of Generative Models via Kernel Distances").

Memory stays bounded: squared distances ``|x|^2 + |y|^2 - 2 x.y`` are formed one
block (GEMM) at a time and never as an n x n or n x m matrix; k-NN radii keep a
running k smallest per row. All data are first centred on the reference mean
(distances do not change) to limit the cancellation in that formula, and every
comparison is between squared distances computed by the same formula.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from distrank._arrays import (
    as_features,
    check_models,
    column_mean,
    product_rows,
    resolve_device,
    work_dtype,
)
from distrank._checks import positive_int
from distrank.clients import client_groups
from distrank.metrics._kernels import Centred, gram_blocks, sq_from_gram
from distrank.metrics._metric import PRDC, check_names, check_sizes, prdc_rows

# Elements of one distance block: 2**24 is 64 MiB in float32, 128 MiB in float64.


def prdc(
    reference,
    clients,
    models: Mapping[str, object],
    *,
    pr_k: int = 3,
    dc_k: int = 5,
    metrics: Sequence[str] = PRDC,
    dtype: str = "float32",
    device=None,
    block_size: int | None = None,
    products=None,
    per_client: bool = True,
) -> dict[str, dict[str, dict[str, float]]]:
    """Score every model against the pooled reference and against each client.

    Parameters
    ----------
    reference, clients, models, device, block_size
        as in :func:`distrank.metrics.score` (``block_size``: rows of a distance block).
    pr_k, dc_k
        k of the k-NN radii for Precision and Recall, and for Density and Coverage.
    metrics
        a subset of ``("precision", "recall", "density", "coverage")``.
    dtype
        ``"float64"`` (exact comparisons) or ``"float32"`` (float32 GEMMs).
    products
        a ``SumsBuilder``, given every product
        block this pass forms, in ``kd._sums.kernel_sums``' order, so that KD needs no
        GEMM of its own; needs ``recall`` and one of the other three metrics.
    per_client
        False: the pooled values alone (no client radii or hits), bit for bit those of True.

    Returns
    -------
    dict
        ``result[model][metric]`` = ``{"all": pooled value, str(label): client value, ...}``
        (``{"all": pooled value}`` when not ``per_client``).

    Raises
    ------
    ValueError
        non-finite features, mismatched dimensions, an empty model, a
        client (or model) with fewer than k + 1 rows, a bad metric name or option.
    """
    wanted = check_names(metrics, PRDC)
    pr_k = positive_int(pr_k, "pr_k")
    dc_k = positive_int(dc_k, "dc_k")
    dtype_ = work_dtype(dtype)
    device = resolve_device(device)
    block = product_rows(block_size, dtype_.itemsize)

    # Validate everything before any heavy computation.
    reference = as_features(reference, "reference")
    n, d = reference.shape
    fakes = check_models(models, d)
    labels, groups, order = _client_groups(clients, n)
    sizes = {("client", label): b - a for label, (a, b) in zip(labels, groups)}
    sizes |= {("model", name): y.shape[0] for name, y in fakes.items()}
    check_sizes(sizes, {m: prdc_rows(m, pr_k, dc_k) for m in wanted})
    ref_ks = _reference_ks(wanted, pr_k, dc_k, products)

    ref = _grouped(reference, order, device, dtype_)
    if products is not None:
        products.reference(ref, np.repeat(np.arange(len(groups)), [b - a for a, b in groups]))

    pool_hook = None if products is None else products.pool
    radii = _reference_radii(ref, groups if per_client else None, ref_ks, block, pool_hook)
    if not per_client:  # from here on, the pool alone
        labels, groups = [], []

    result = {}
    for name, y in fakes.items():
        fake = Centred.of(y.to(device=device, dtype=dtype_), ref.center)
        if products is not None:
            products.start_model(fake)
        hits = _hits(ref, fake, groups, radii, wanted, (pr_k, dc_k), block, products)
        result[name] = _values(hits, labels, groups, wanted, dc_k, fake.rows.shape[0])
    return result


def _grouped(reference, order, device, dtype_) -> Centred:
    """The reference rows grouped by client, so that a client is a slice, centred on their
    mean, which leaves distances unchanged but reduces cancellation."""
    ref = reference[torch.as_tensor(order, device=reference.device)]
    ref = ref.to(device=device, dtype=dtype_)
    return Centred.of(ref, column_mean(ref).to(dtype_), in_place=True)


def _reference_ks(wanted, pr_k: int, dc_k: int, products) -> list[int]:
    """k of the reference radii, pooled and within every client. ``products`` needs
    the pooled reference's blocks (these radii) and each model's (recall's radii)."""
    ks = sorted(
        {pr_k for m in wanted if m == "precision"}
        | {dc_k for m in wanted if m in ("density", "coverage")}
    )
    if products is not None and not ("recall" in wanted and ks):
        raise ValueError(
            "products: KD shares PRDC's products only when recall and one of "
            "precision, density, coverage are wanted"
        )
    return ks


def _client_groups(clients, n: int) -> tuple[list[str], list[tuple[int, int]], np.ndarray]:
    """Client names (str of each label, sorted), their row slices, and the row order
    that groups the reference by client (stable within a client)."""
    groups = client_groups(clients, n)
    stops = np.cumsum(groups.sizes).tolist()
    return groups.names, list(zip([0] + stops[:-1], stops)), np.argsort(groups.index, kind="stable")


def _knn_sq_radii(
    x, x_sq, ks: Sequence[int], block: int, on_gram=None, groups=None
) -> dict[int, torch.Tensor] | tuple[dict, dict]:
    """Squared distance of each row of x to its k-th nearest other row, for each k.

    Distances are symmetric, so only the blocks on and above the diagonal are formed
    (half the GEMMs): block (r, c) offers its rows' candidates along its rows and
    its columns' candidates along its columns. ``on_gram(rows, cols, products)``,
    if given, gets each block's products after its distances are formed. ``groups``,
    row ranges (start, stop) that tile x (the clients): each row's radii within its
    range too, from the blocks' parts within a range (no GEMM of their own), as a
    second dict.
    """
    n, kmax = x.shape[0], max(ks)
    best = torch.full((n, kmax), torch.inf, dtype=x.dtype, device=x.device)
    local = None if groups is None else best.clone()
    for rows, cols, gram in gram_blocks(x, None, block):
        d2 = sq_from_gram(gram, x_sq[rows], x_sq[cols])
        if on_gram is not None:
            on_gram(rows, cols, gram)
        if rows == cols:  # a square block: the point itself is not its own neighbour
            d2.fill_diagonal_(torch.inf)
        _keep_smallest(best[rows], d2)
        if rows != cols:
            _keep_smallest(best[cols], d2.T.contiguous())
        for a, b in groups or ():
            r0, r1, c0, c1 = (
                max(a, rows.start),
                min(b, rows.stop),
                max(a, cols.start),
                min(b, cols.stop),
            )
            if r0 < r1 and c0 < c1:
                part = d2[r0 - rows.start : r1 - rows.start, c0 - cols.start : c1 - cols.start]
                _keep_smallest(local[r0:r1], part)
                if rows != cols:
                    _keep_smallest(local[c0:c1], part.T.contiguous())
    radii = {k: best[:, k - 1].clone() for k in ks}
    return radii if groups is None else (radii, {k: local[:, k - 1].clone() for k in ks})


def _keep_smallest(best: torch.Tensor, d2: torch.Tensor) -> None:
    """``best`` (rows, k) <- the k smallest of ``best`` and of each row of ``d2``, sorted."""
    k = best.shape[1]
    nearest = d2.topk(min(k, d2.shape[1]), dim=1, largest=False).values
    best.copy_(torch.cat([best, nearest], dim=1).topk(k, dim=1, largest=False).values)


def _reference_radii(ref: Centred, groups, ks, block, on_gram=None):
    """Squared k-NN radii of each reference row within the pool and within its client
    (``on_gram``: see :func:`_knn_sq_radii`, for the pool's blocks); ``groups`` None:
    the pool's only (None for the clients')."""
    if not ks:
        return {}, {}
    if groups is None:
        return _knn_sq_radii(ref.rows, ref.sq, ks, block, on_gram), None
    return _knn_sq_radii(ref.rows, ref.sq, ks, block, on_gram, groups)


def _hits(ref: Centred, fake: Centred, groups, radii2, wanted, ks, block, products=None):
    """One pass over reference x model blocks, for the pool and every client at once.

    ``radii2`` is (pooled, client) squared reference radii by k, ``ks`` is (pr_k, dc_k).
    Returns per metric: ``recall`` (n,) bool, whether a reference row lies in some
    fake ball; ``precision`` (1 + clients, m) bool, whether a fake row lies in some
    reference ball, with pooled radii (row 0) and with each client's radii;
    ``density`` (2, n) int, fake rows inside each reference ball (pooled, client
    radii); ``coverage`` (2, n) bool, nearest fake row inside the ball. ``products``
    gets the model's own blocks (``model_self``) and the cross blocks (``cross``).
    Client radii None (and no ``groups``): the pooled rows alone (density's client row
    stays 0, coverage has one row).
    """
    (pooled_r2, client_r2), (pr_k, dc_k) = radii2, ks
    n, m = ref.rows.shape[0], fake.rows.shape[0]
    radii = {"pooled": pooled_r2, "client": client_r2, "pr_k": pr_k, "dc_k": dc_k}
    if "recall" in wanted:
        on_gram = None if products is None else products.model_self
        radii["fake"] = _knn_sq_radii(fake.rows, fake.sq, [pr_k], block, on_gram)[pr_k]
    hits = _no_hits(wanted, n, m, len(groups), ref.rows)
    segments = {}  # row block start -> (client, first row, end row) within the block
    for rows, cols, gram in gram_blocks(ref.rows, fake.rows, block):
        d2 = sq_from_gram(gram, ref.sq[rows], fake.sq[cols])
        if products is not None:
            products.cross(rows, cols, gram)
        if rows.start not in segments:
            segments[rows.start] = [
                (c, max(a, rows.start) - rows.start, min(b, rows.stop) - rows.start)
                for c, (a, b) in enumerate(groups)
                if a < rows.stop and b > rows.start
            ]
        _add_block(hits, d2, rows, cols, segments[rows.start], radii)
    if "coverage" in wanted:
        nearest_d2 = hits.pop("nearest_d2")
        radii = [pooled_r2] if client_r2 is None else [pooled_r2, client_r2]
        hits["coverage"] = torch.stack([nearest_d2 < r2[dc_k] for r2 in radii])
    return {metric: h.cpu() for metric, h in hits.items()}


def _no_hits(wanted, n: int, m: int, n_clients: int, ref) -> dict[str, torch.Tensor]:
    """The hit arrays of :func:`_hits` before any block (coverage: the nearest fake
    row's squared distance, ``nearest_d2``, infinite)."""
    dev = ref.device
    hits = {}
    if "recall" in wanted:
        hits["recall"] = torch.zeros(n, dtype=torch.bool, device=dev)
    if "precision" in wanted:
        hits["precision"] = torch.zeros(1 + n_clients, m, dtype=torch.bool, device=dev)
    if "density" in wanted:
        hits["density"] = torch.zeros(2, n, dtype=torch.int64, device=dev)
    if "coverage" in wanted:
        hits["nearest_d2"] = torch.full((n,), torch.inf, dtype=ref.dtype, device=dev)
    return hits


def _add_block(hits, d2, rows: slice, cols: slice, segments, radii) -> None:
    """Add the block ``d2`` of reference rows ``rows`` x model rows ``cols`` to ``hits``."""
    pooled_r2, client_r2, pr_k, dc_k = (radii[k] for k in ("pooled", "client", "pr_k", "dc_k"))
    if "recall" in hits:
        hits["recall"][rows] |= _any(d2 < radii["fake"][cols].unsqueeze(0), dim=1)
    if "precision" in hits:
        inside = d2 < pooled_r2[pr_k][rows].unsqueeze(1)
        hits["precision"][0, cols] |= _any(inside, dim=0)
        if client_r2 is not None:
            inside = d2 < client_r2[pr_k][rows].unsqueeze(1)
        for c, a, b in segments:
            hits["precision"][1 + c, cols] |= _any(inside[a:b], dim=0)
    if "density" in hits:
        radii = (pooled_r2,) if client_r2 is None else (pooled_r2, client_r2)
        for row, r2 in enumerate(radii):
            hits["density"][row, rows] += _count_true(d2 < r2[dc_k][rows].unsqueeze(1), dim=1)
    if "nearest_d2" in hits:
        nearest_d2 = hits["nearest_d2"]
        torch.minimum(nearest_d2[rows], d2.amin(dim=1), out=nearest_d2[rows])


# On CPU, reductions over uint8 are several times faster than over bool.
def _any(mask: torch.Tensor, dim: int) -> torch.Tensor:
    return mask.view(torch.uint8).amax(dim=dim).bool()


def _count_true(mask: torch.Tensor, dim: int) -> torch.Tensor:
    return mask.view(torch.uint8).sum(dim=dim, dtype=torch.int32)


def _values(hits, labels, groups, wanted, dc_k, m) -> dict[str, dict[str, float]]:
    """Values from the hit counts, in the same float64 arithmetic as the prdc package."""

    def rate(h) -> float:
        return int(h.sum()) / h.numel()

    def density(h) -> float:
        return (1.0 / float(dc_k)) * (int(h.sum()) / m)

    out = {}
    for metric in wanted:
        h = hits[metric]
        if metric == "precision":
            out[metric] = {"all": rate(h[0])}
            out[metric] |= {name: rate(h[1 + c]) for c, name in enumerate(labels)}
        else:
            value = density if metric == "density" else rate
            out[metric] = {"all": value(h if metric == "recall" else h[0])}
            for name, (a, b) in zip(labels, groups):
                out[metric][name] = value((h if metric == "recall" else h[1])[a:b])
    return out
