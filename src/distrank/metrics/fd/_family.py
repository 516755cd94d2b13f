"""FD, the Fréchet distance of Gaussian fits: its family and its metric.

plain: per client, then pooled from the clients' statistics (``fd._frechet.pool_stats``), in
chunks of models and of clients (memory: a chunk of each, whatever their numbers); the
pooled value alone (``Inputs.per_client`` False) from the same statistics, without the
clients' Fréchet distances.
partitions: one product of the reference with each model serves every partition
(``fd._partitions.partition_fds``).
"""

from __future__ import annotations

from collections.abc import Sequence

from distrank.metrics._family import Family, Inputs, Pooled, Run, SecureSum, Values
from distrank.metrics._metric import Metric, Rows

#: Bytes of model statistics (a (d, d) covariance, or the (d, m <= d) centred rows) FD
#: holds at once: models are scored in chunks of this.
FD_CHUNK_BYTES = 512 * 2**20


class FD(Family):
    def plain(self, inputs: Inputs, keys: Sequence[str]) -> Run:
        import numpy as np

        from distrank.metrics.fd._frechet import (
            GaussianStats,
            factored,
            frechet_distances,
            gaussian_stats,
            pool_stats,
        )

        def compute() -> Values:
            # Models in chunks of FD_CHUNK_BYTES of factors, each factored once. Per chunk, the
            # clients come one at a time: each covariance joins the pool's sum as it comes,
            # and what FD needs of the client (its kept rows, else its covariance) is held
            # for one call with the models per FD_CHUNK_BYTES of clients (their factors
            # and pairs side by side). Memory: a chunk of models and one of clients, and
            # the pool's sum, whatever the numbers of clients and models.
            dev, k, names = inputs.device, len(inputs.groups.sizes), list(inputs.models)
            d = next(iter(inputs.models.values())).shape[1]
            chunk = max(1, FD_CHUNK_BYTES // (8 * d * d))
            fd = np.empty((k + 1, len(names)))

            def clients(cols: slice, models: list):  # each client's statistics, for the pool
                held = {}
                for c in range(k):
                    s = gaussian_stats(inputs.client_rows(c), device=dev)
                    if not inputs.per_client:  # the pool's statistics only
                        yield s
                        continue
                    held[c] = s if s.factor is None else GaussianStats(s.n, s.mean, None, s.factor)
                    if c == k - 1 or sum(_bytes(h) for h in held.values()) >= FD_CHUNK_BYTES:
                        values = frechet_distances(list(held.values()), models, device=dev)
                        fd[list(held), cols] = values
                        held.clear()
                    yield s

            for start in range(0, len(names), chunk):
                cols = slice(start, start + chunk)
                model_stats = factored(
                    [
                        gaussian_stats(inputs.models[n], device=dev, covariance=False)
                        for n in names[cols]
                    ],
                    device=dev,
                )
                pooled = pool_stats(clients(cols, model_stats))
                fd[k, cols] = frechet_distances([pooled], model_stats, device=dev)[0]
            local = fd[:-1].T if inputs.per_client else [None] * len(names)  # model -> (k,)
            return {name: {"fd": (float(fd[-1, g]), local[g])} for g, name in enumerate(names)}

        return Run(compute)

    def partitions(self, inputs: Inputs, keys: Sequence[str]) -> dict[str, Values]:
        from distrank.metrics.fd._partitions import partition_fds

        fds = partition_fds(inputs.reference, inputs.partitions, inputs.models, inputs.device)
        return {
            p: {name: {"fd": value} for name, value in by_model.items()}
            for p, by_model in fds.items()
        }


def _bytes(s) -> int:
    """The bytes of a statistics' covariance or factor."""
    return (s.factor if s.cov is None else s.cov).nbytes


class Gaussians(Pooled):
    """FD_all from the sites' Gaussian statistics (n_i, mean_i, C_i): the pooled Gaussian
    fit of their rows (``fd._frechet.pool_stats``), exactly."""

    def site(self, x, device=None) -> dict:
        from distrank.metrics.fd._frechet import gaussian_stats

        stats = gaussian_stats(x, device=device)
        return {"mean": stats.mean, "cov": stats.cov}

    def check(self, stats, n: int) -> None:
        mean, cov = stats.get("mean"), stats.get("cov")
        if mean is None or cov is None or mean.ndim != 1 or cov.shape != (len(mean), len(mean)):
            shapes = {k: getattr(v, "shape", None) for k, v in stats.items()}
            raise ValueError(f"statistics of shapes {shapes}: expected mean (d,) and cov (d, d)")

    def finish(self, sites, models, device=None) -> dict[str, float]:
        from distrank.metrics.fd._frechet import (
            GaussianStats,
            frechet_distances,
            gaussian_stats,
            pool_stats,
        )

        pooled = pool_stats([GaussianStats(n, s["mean"], s["cov"]) for n, s in sites])
        fitted = [gaussian_stats(y, device=device) for y in models.values()]
        return dict(zip(models, frechet_distances([pooled], fitted, device=device)[0].tolist()))


class Moments(SecureSum):
    """FD_all from the pooled moments: each site adds S1 = sum_rows (x - c) and the upper
    triangle of S2 = sum_rows (x - c)(x - c)^T, c a public centre (the mean of the
    models' rows, against cancellation); the server's pooled N(c + S1 / n, (S2 - S1 S1^T
    / n) / (n - 1)) is the Gaussian fit of the pooled rows. Rows within 2 F of c bound
    the entries by 2 F N and 4 F^2 N; FD's bound follows the moments' errors (``fd_bound``)."""

    moments = True

    def blocks(self, plan) -> list[tuple[str, int, float]]:
        f, n, d = plan.feature_bound, plan.max_rows, plan.dim
        return [("sum", d, 2 * f * n), ("scatter", d * (d + 1) // 2, 4 * f * f * n)]

    def site(self, plan, x, scores, centre, device=None) -> list:
        import numpy as np

        from distrank.metrics.fd._frechet import gaussian_stats

        n, stats = len(x), gaussian_stats(x, device=device)
        offset = stats.mean - np.asarray(centre, np.float64)
        scatter = (n - 1) * stats.cov + n * np.outer(offset, offset)
        return [n * offset, scatter[np.triu_indices(plan.dim)]]

    def finish(self, plan, sums, n, k, centre, models, errors, device=None):
        import numpy as np

        from distrank.metrics.fd._frechet import (
            GaussianStats,
            fd_bound,
            frechet_distances,
            gaussian_stats,
        )

        s1, s2 = sums["sum"], np.zeros((plan.dim, plan.dim))
        s2[np.triu_indices(plan.dim)] = sums["scatter"]
        s2 = s2 + s2.T - np.diag(np.diag(s2))
        cov = (s2 - np.outer(s1, s1) / n) / (n - 1)
        pooled = GaussianStats(n, np.asarray(centre) + s1 / n, cov)
        fitted = [gaussian_stats(models[name], device=device) for name in plan.models]
        values = frechet_distances([pooled], fitted, device=device)[0]
        e1, e2 = errors["sum"], errors["scatter"]
        return {"all": (values, np.array([fd_bound(pooled, y, s1, e1, e2) for y in fitted]))}


FD_METRIC = Metric(
    "fd",
    "FD",
    False,
    FD(),
    lambda o: Rows(2, 2, "FD (covariance, ddof=1)"),
    why_not="Theorem 2 and Proposition 1: FD_avg - FD_all depends on the model's mean and "
    "covariance; FD_avg is minimised by the clients' Wasserstein barycenter, FD_all by the "
    "pooled Gaussian, so two models can swap order.",
    secure=Moments(),
    pooled=Gaussians(),
    pooled_from="the clients' (n_i, mean, covariance), not from their FD scores; share those "
    "statistics to compute it",
)
