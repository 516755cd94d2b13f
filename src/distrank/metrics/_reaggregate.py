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
from dataclasses import replace

import pandas as pd

from distrank.metrics._options import ScoreOptions, score_options
from distrank.metrics._scoring import by_family, prepare
from distrank.metrics._table import COLUMNS, from_values


def score_partitions(
    reference,
    partitions: Mapping[str, object],
    models: Mapping[str, object],
    options: ScoreOptions | Mapping | None = None,
    *,
    device=None,
    block_size: int | None = None,
    **changes,
) -> pd.DataFrame:
    """:func:`distrank.metrics.score` of every partition, sharing the partition-free work.

    Each metric's family takes its ``partitions`` path (module doc) or, without one,
    scores each partition afresh. Cost: the kernel sums are formed once for the common
    refinement of the partitions (B fine groups; B x B sums), so block-aligned
    partitions keep B small. Memory holds one model's (n, m) products at a time.

    Parameters
    ----------
    reference
        (n, d) reference features.
    partitions
        partition name -> (n,) client label (int or str) of each row.
    models
        model name -> (m, d) generated features.
    options, changes, device, block_size
        as in :func:`distrank.metrics.score`;
        ``kd_estimator`` is ``"unbiased"`` or ``"biased"`` (random subsets have no
        partition-free sums).

    Returns
    -------
    pandas.DataFrame
        The tables of :func:`distrank.metrics.score`, one per partition, stacked with a
        first column ``partition``.
    """
    opts = score_options(options, **changes)
    if not isinstance(partitions, Mapping):
        raise ValueError("partitions: expected a non-empty mapping of name -> (n,) labels")
    inputs = prepare(reference, partitions, models, opts, device=device, block_size=block_size)
    values = {p: {g: {} for g in inputs.models} for p in inputs.partitions}
    for family, keys in by_family(inputs.options.metrics).items():
        shared = family.partitions(inputs, keys)
        for p in inputs.partitions:
            if shared is not None:
                part = shared[p]
            else:  # the family's plain path on this partition alone, as ``score`` has it
                one = inputs.partition(p)
                part = family.plain(
                    replace(one, options=one.options.replace(metrics=tuple(keys))), keys
                ).compute()
            for name, by_metric in part.items():
                values[p][name] |= by_metric
    weights = inputs.options.weights
    tables = [
        from_values(values[p], g.names, g.weights(weights)).assign(partition=p)
        for p, g in inputs.partitions.items()
    ]
    return pd.concat(tables, ignore_index=True)[["partition", *COLUMNS]]
