"""KD, the kernel distance (squared MMD): its family and its metric.

plain: one set of kernel block sums (``kd._sums.kernel_sums``, U or V form) or KID-style
random subsets (``kd._subsets.subset_kd``, with a ``kd_std`` spread); it can take its
sums from PRDC's distance blocks (``Run.from_sums``). partitions: the sums of the
partitions' common refinement, coarsened per partition (``KernelSums.coarsen``).
resample: re-weighted sums of every bootstrap resample (``kd._resample``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distrank.metrics._family import Family, Inputs, Run, Values, WeightedSum
from distrank.metrics._metric import ESTIMATORS, SAFE, Metric, Option, check_full_sample, kd_rows

# KD's own options (the kernel, its parameters and the seed are shared, metrics._options)
KD_ESTIMATOR = Option("kd_estimator", str, "unbiased", "KD estimator", choices=ESTIMATORS)
N_SUBSETS = Option("n_subsets", int, 100, "subsets estimator: number of subsets", minimum=1)
SUBSET_SIZE = Option("subset_size", int, 1000, "subsets estimator: rows per subset", minimum=1)


class KD(Family):
    uses_kernel = True

    def plain(self, inputs: Inputs, keys: Sequence[str]) -> Run:
        from distrank.metrics.kd._subsets import subset_kd
        from distrank.metrics.kd._sums import kernel_sums

        o, x, groups, names = inputs.options, inputs.reference, inputs.groups, list(inputs.models)

        def from_sums(sums) -> Values:
            per_client, pooled = sums.kd(o.kd_estimator)
            return {name: {"kd": (float(pooled[g]), per_client[g])} for g, name in enumerate(names)}

        def compute() -> Values:
            if o.kd_estimator != "subsets":
                return from_sums(
                    kernel_sums(
                        x,
                        groups.index,
                        inputs.models.values(),
                        inputs.kernel,
                        dtype=o.dtype,
                        device=inputs.device,
                        block_size=inputs.block_size,
                    )
                )
            mean, std = subset_kd(
                x,
                groups.index,
                list(inputs.models.values()),
                inputs.kernel,
                n_subsets=o.n_subsets,
                subset_size=o.subset_size,
                seed=o.seed,
                dtype=o.dtype,
                device=inputs.device,
                block_size=inputs.block_size,
            )
            return {
                name: {"kd": (mean[g, 0], mean[g, 1:]), "kd_std": (std[g, 0], std[g, 1:])}
                for g, name in enumerate(names)
            }

        if o.kd_estimator == "subsets":  # random subsets: no full-sample sums to share
            return Run(compute)
        return Run(compute, kernel=inputs.kernel, from_sums=from_sums)

    def partitions(self, inputs: Inputs, keys: Sequence[str]) -> dict[str, Values] | None:
        import logging

        from distrank.clients import common_refinement
        from distrank.metrics.kd._sums import kernel_sums

        o, ys = inputs.options, inputs.models
        if o.kd_estimator == "subsets":  # random subsets share nothing: each partition afresh
            return None
        fine = common_refinement([g.index for g in inputs.partitions.values()])
        logging.getLogger("distrank.metrics._reaggregate").info(
            "KD: kernel sums over %d fine groups, shared by %d partitions",
            int(fine.max()) + 1,
            len(inputs.partitions),
        )
        sums = kernel_sums(
            inputs.reference,
            fine,
            ys.values(),
            inputs.kernel,
            dtype=o.dtype,
            device=inputs.device,
            block_size=inputs.block_size,
        )
        first_row = np.unique(fine, return_index=True)[1]
        out = {}
        for p, g in inputs.partitions.items():
            per_client, pooled = sums.coarsen(g.index[first_row]).kd(o.kd_estimator)
            out[p] = {name: {"kd": (float(pooled[j]), per_client[j])} for j, name in enumerate(ys)}
        return out

    def check_resample(self, options) -> None:
        check_full_sample(options.kd_estimator, why=" (bootstrap KD re-weights the full samples)")

    def resample(self, inputs: Inputs, keys: Sequence[str], client_draws, model_draws):
        """(batch, 1, M, 2 + k): KD of each resample by re-weighting (``kd._resample``), its
        ``avg`` KD's own (``KD_METRIC.average``)."""
        from distrank.metrics.kd._resample import resampled_kernel_sums, row_counts

        o, ys, groups = inputs.options, list(inputs.models.values()), inputs.groups
        counts = np.zeros((client_draws[0].shape[0], inputs.reference.shape[0]), dtype=np.int64)
        for c, draws in enumerate(client_draws):
            r = groups.rows(c)
            counts[:, r] = row_counts(draws, len(r))
        sums = resampled_kernel_sums(
            inputs.reference,
            groups.index,
            ys,
            inputs.kernel,
            counts,
            [row_counts(d, y.shape[0]) for d, y in zip(model_draws, ys)],
            estimator=o.kd_estimator,
            dtype=o.dtype,
            device=inputs.device,
            block_size=inputs.block_size,
        )
        lam = groups.weights(o.weights)
        out = []
        for s in sums:
            per_client, pooled = s.kd(o.kd_estimator)
            out.append(np.column_stack([pooled, KD_METRIC.average(per_client, lam), per_client]))
        return np.stack(out)[:, None]


def _kd_unit(bounds, options) -> float | None:
    """The most n_i KD_i moves when one row is replaced: 4 (hi - lo) for the full-sample
    estimators (module ``metrics.kd._privacy``); random subsets are not bounded here."""
    return None if options.kd_estimator == "subsets" else 4.0 * bounds.kernel_width


KD_METRIC = Metric(
    "kd",
    "KD",
    False,
    KD(),
    lambda o: kd_rows(o.kd_estimator, o.subset_size),
    agrees=SAFE,
    consistent="Theorem 1: KD_avg = KD_all + sum_i lambda_i KD(P_bar, P_i), a model-free offset",
    breaks={
        "weights": {
            "uniform": "Theorem 1 needs weights n_i/n; with uniform weights the gap "
            "KD_avg - KD_all depends on the model"
        },
        "kd_estimator": {
            "subsets": "KID-style random subsets: Theorem 1 holds in expectation only; "
            "use the unbiased or biased estimator"
        },
    },
    # |KD| <= 4 K for every estimator, K the kernel's maximum on the public ball;
    # replacing a row moves n_i KD_i by at most 4 (hi - lo), the kernel's range on the
    # ball (4 for rbf/laplace: metrics.kd._privacy.SUM_SENSITIVITY), for U and V statistics
    secure=WeightedSum("kd", lambda plan: 4 * plan.kernel_bound, unit=_kd_unit),
    provided="the clients used weights n_i/n, one kernel (a bandwidth fixed for all), the "
    "same samples and a full-sample estimator",
    pooled_from="kernel sums across clients (its offset)",
    spreads=("kd_std",),
    options=(KD_ESTIMATOR, N_SUBSETS, SUBSET_SIZE),
)
