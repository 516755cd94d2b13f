"""FD, the Fréchet distance of Gaussian fits: its family and its metric.

plain: per client, then pooled from the clients' statistics (``fd.pool_stats``), in
chunks of models (memory: a chunk of models' and two clients' covariances).
partitions: one product of the reference with each model serves every partition
(``fd.partition_fds``).
"""

from __future__ import annotations

from collections.abc import Sequence

from distrank.metrics.families.base import Family, Inputs, Partitioned, Run, Values
from distrank.metrics.metric import Metric, Rows

#: Bytes of model covariances FD holds at once (models are scored in chunks of this).
FD_CHUNK_BYTES = 256 * 2**20


class FD(Family):
    def plain(self, inputs: Inputs, keys: Sequence[str]) -> Run:
        import numpy as np

        from distrank.metrics.fd import frechet_distances, gaussian_stats, pool_stats

        def compute() -> Values:
            # Models in chunks of FD_CHUNK_BYTES of covariances; per chunk, one client's
            # (d, d) statistics at a time, pooled as they come: memory holds a chunk of
            # models' and two clients' covariances, whatever the numbers of clients and models.
            dev, k, names = inputs.device, len(inputs.groups.sizes), list(inputs.models)
            d = next(iter(inputs.models.values())).shape[1]
            chunk = max(1, FD_CHUNK_BYTES // (8 * d * d))
            fd = np.empty((k + 1, len(names)))
            for start in range(0, len(names), chunk):
                cols = slice(start, start + chunk)
                model_stats = [gaussian_stats(inputs.models[n], device=dev) for n in names[cols]]
                pooled = None
                for c in range(k):
                    stats = gaussian_stats(inputs.client_rows(c), device=dev)
                    fd[c, cols] = frechet_distances([stats], model_stats, device=dev)[0]
                    pooled = stats if pooled is None else pool_stats([pooled, stats])
                fd[k, cols] = frechet_distances([pooled], model_stats, device=dev)[0]
            return {name: {"fd": (float(fd[-1, g]), fd[:-1, g])} for g, name in enumerate(names)}

        return Run(compute)

    def partitions(self, inputs: Partitioned, keys: Sequence[str]) -> dict[str, Values]:
        from distrank.metrics.fd import partition_fds

        fds = partition_fds(inputs.reference, inputs.partitions, inputs.models, inputs.device)
        return {
            p: {name: {"fd": value} for name, value in by_model.items()}
            for p, by_model in fds.items()
        }


FD_METRIC = Metric(
    "fd",
    "FD",
    False,
    FD(),
    lambda o: Rows(2, 2, "FD (covariance, ddof=1)"),
    why_not="Theorem 2 and Proposition 1: FD_avg - FD_all depends on the model's mean and "
    "covariance; FD_avg is minimised by the clients' Wasserstein barycenter, FD_all by the "
    "pooled Gaussian, so two models can swap order.",
)
