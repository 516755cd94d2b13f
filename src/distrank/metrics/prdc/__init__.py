"""Precision, Recall, Density and Coverage: every piece of them in one place.

``scores`` (one blocked pass over the distance blocks), ``partitions`` (many partitions
of one reference, sharing what no partition changes) and ``family`` (their compute paths
and their four :class:`~distrank.metrics.metric.Metric` objects). Torch-free until a
submodule is imported.
"""
