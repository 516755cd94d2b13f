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

from collections.abc import Mapping

import pandas as pd

from distrank._arrays import as_features, resolve_device
from distrank._checks import about
from distrank.clients import client_groups, common_refinement
from distrank.metrics import kd as kd_
from distrank.metrics.families import Partitioned
from distrank.metrics.options import ScoreOptions, score_options
from distrank.metrics.registry import METRICS
from distrank.metrics.scoring import check_models, check_rows, kernel_of, prepare
from distrank.metrics.table import COLUMNS, from_values

__all__ = ["coarsen", "common_refinement", "score_partitions"]


def coarsen(sums: kd_.KernelSums, fine_to_client) -> kd_.KernelSums:
    """The kernel sums of the partition that gives fine group g to client
    ``fine_to_client[g]`` (``KernelSums.coarsen``)."""
    return sums.coarsen(fine_to_client)


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

    Each metric's family takes its ``partitions`` path (module doc) or, without one,
    scores each partition afresh. Cost: the kernel sums are formed once for the common
    refinement of the partitions (B fine groups; B x B sums), so block-aligned
    partitions keep B small. Memory holds one model's (n, m) products at a time.
    """
    opts = score_options(options, **changes)
    with about("reference"):
        x = as_features(reference, "reference")
    ys = check_models(models, x.shape[1])
    if not isinstance(partitions, Mapping) or not partitions:
        raise ValueError("partitions: expected a non-empty mapping of name -> (n,) labels")
    groups = {}
    for name, labels in partitions.items():
        try:
            groups[str(name)] = client_groups(labels, x.shape[0])
            check_rows(groups[str(name)], ys, opts)
        except ValueError as err:
            raise type(err)(f"partitions[{name!r}]: {err}") from None
    kernel, opts = kernel_of(x, opts)
    inputs = Partitioned(x, groups, ys, opts, kernel, resolve_device(device), block_size)
    values = {p: {g: {} for g in ys} for p in groups}
    by_family: dict = {}
    for key in opts.metrics:
        by_family.setdefault(METRICS[key].family, []).append(key)
    for family, keys in by_family.items():
        shared = family.partitions(inputs, keys)
        for p, g in groups.items():
            part = shared[p] if shared is not None else _afresh(family, inputs, g, keys)
            for name, by_metric in part.items():
                values[p][name] |= by_metric
    tables = [
        from_values(values[p], g.names, g.weights(opts.weights)).assign(partition=p)
        for p, g in groups.items()
    ]
    return pd.concat(tables, ignore_index=True)[["partition", *COLUMNS]]


def _afresh(family, inputs: Partitioned, groups, keys) -> dict:
    """The values of one partition from the family's plain path, as ``score`` has them."""
    o = inputs.options.replace(metrics=tuple(keys))
    prepared = prepare(inputs.reference, groups.index, inputs.models, o, device=inputs.device)
    return family.plain(prepared, keys).compute()
