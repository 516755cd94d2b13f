"""Secure mode (``secure = true``): the server learns the sum of the sites' vectors, nothing else.

With lambda_i = n_i / n, KD_avg and Recall_avg are weighted sums, and FD_all needs
only the pooled moments, which are sums too. Each site sends, through Flower's
SecAgg+ (Bell et al., "Secure single-server aggregation with (poly)logarithmic
overhead", CCS 2020: ``SecAggPlusWorkflow`` on the server, ``secaggplus_mod`` on
the site), the vector

    [n_i,  w_i KD_i(model 1..M),  w_i Recall_i(1..M),
     S1_i = sum_rows (x - c),  upper triangle of S2_i = sum_rows (x - c)(x - c)^T]

(w_i = n_i for ``weights = "size"``, 1 for ``"uniform"``; the FD part only when FD is
requested, and every site allows it: policy ``share-stats``; c is a public
centre, the mean of all generated rows, against cancellation). The server unmasks
only the sum over the sites and writes

    KD, Recall  avg = sum_i w_i D_i / sum_i w_i           (as ``distrank score``)
    FD          all = FD(N(c + S1 / n, (S2 - S1 S1^T / n) / (n - 1)), model)

which are FD_all on the pooled rows: S2 - S1 S1^T / n is the pooled scatter, hence
the (n - 1) of the pooled covariance. No ``client`` rows (nobody has them), no
``kd_std``, and no FD_avg, which need not rank like FD_all. Precision, Density and
Coverage are refused: the pooled value needs nearest-neighbour radii among all sites'
rows, which no sum of site values gives, and their client averages need not rank like
the pooled metric. Each metric says how it enters the sum (``Metric.secure``, a
``metrics._family.SecureSum``): a metric without one is refused.

Quantisation and the message layout: :mod:`~distrank.flower.secure.plan`; the site,
its policy and its failure categories: :mod:`~distrank.flower.secure.site`; the
server: :mod:`~distrank.flower.secure.server`; FD's bound:
``metrics.fd._frechet.fd_bound``. Masks come from SHAKE-256 of the whole shared secret
(:mod:`distrank.flower.masks`), not from Flower 1.42's 32-bit fold.

Noise is each site's own (its release policy, :mod:`distrank.flower.policy`): a site
of (epsilon, delta) and ``colluders`` c adds a 1 / (t - c) share of each block's
variance, calibrated for the block's sensitivity under the request, so every sum the
server can unmask is (epsilon, delta)-DP for its rows while at most c sites collude.

Threat model: ``docs/flower.md`` (who learns what, per mode).
"""

from distrank.flower.secure.plan import SECURE_CONFIG

__all__ = ["SECURE_CONFIG"]
