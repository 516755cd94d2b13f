"""FD, the Fréchet distance of Gaussian fits: every piece of it in one place.

``frechet`` (Gaussian statistics, their pooling, FD and its terms), ``bands`` (the banded
factors), ``partitions`` (FD of many partitions of one reference), ``settings`` (FD in
several settings: PCA bases, extrapolation in 1/m, with its terms) and ``family`` (its
compute paths, its secure and pooled sums, its :class:`~distrank.metrics.metric.Metric`).
Torch-free until a submodule is imported.
"""
