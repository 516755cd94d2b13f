"""KD, the kernel distance (squared MMD): every piece of it in one place.

``sums`` (the kernel block sums and KD of every client and the pool, the differentiable
objective, one pair), ``subsets`` (KID-style random subsets), ``resample`` (the sums of
bootstrap resamples by re-weighting), ``privacy`` (a client's Gaussian release of its KD)
and ``family`` (its compute paths and its
:class:`~distrank.metrics.metric.Metric`). Torch-free until a submodule is imported.
"""
