"""Precision, Recall, Density and Coverage: one family, four metrics.

plain: one blocked pass over the distance blocks (``prdc._scores.prdc``; the pool's radii and
hits alone where ``Inputs.per_client`` is False); with Recall and one of the other three it
forms every product KD's sums need, so it feeds them (``Run.feeds_products``). partitions:
the distance blocks of each model serve every partition (``prdc._partitions.partition_prdc``).
"""

from __future__ import annotations

from collections.abc import Sequence

from distrank.metrics._family import Family, Inputs, Run, Values, WeightedSum
from distrank.metrics._metric import EXACT, Metric, Option, prdc_rows

# The k of the k-NN radii, Precision and Recall's and Density and Coverage's.
PR_K = Option("pr_k", int, 3, "k of Precision and Recall", minimum=1)
DC_K = Option("dc_k", int, 5, "k of Density and Coverage", minimum=1)


class PRDC(Family):
    def plain(self, inputs: Inputs, keys: Sequence[str]) -> Run:
        import numpy as np

        from distrank.metrics.prdc._scores import prdc

        o, groups = inputs.options, inputs.groups

        def compute(products=None) -> Values:
            result = prdc(
                inputs.reference,
                groups.index,
                inputs.models,
                pr_k=o.pr_k,
                dc_k=o.dc_k,
                metrics=keys,
                dtype=o.dtype,
                device=inputs.device,
                block_size=inputs.block_size,
                products=products,
                per_client=inputs.per_client,
            )
            clients = [str(c) for c in range(len(groups.names))]

            def local(by_client: dict):
                return np.array([by_client[c] for c in clients]) if inputs.per_client else None

            return {
                name: {m: (float(result[name][m]["all"]), local(result[name][m])) for m in keys}
                for name in inputs.models
            }

        # Recall's model radii and another metric's reference radii: every product KD needs
        return Run(compute, feeds_products="recall" in keys and len(keys) > 1)

    def partitions(self, inputs: Inputs, keys: Sequence[str]) -> dict[str, Values]:
        from distrank._arrays import work_dtype
        from distrank.metrics.prdc._partitions import partition_prdc

        o = inputs.options
        return partition_prdc(
            inputs.reference,
            inputs.partitions,
            inputs.models,
            list(keys),
            o.pr_k,
            o.dc_k,
            work_dtype(o.dtype),
            inputs.device,
        )


def _metric(key: str, **verdict) -> Metric:
    """A metric of this family, higher is better, with the rows its k-NN radii need
    (``metric.prdc_rows``) and the k it reads."""
    return Metric(
        key,
        key.capitalize(),
        True,
        _FAMILY,
        lambda options: prdc_rows(key, options.pr_k, options.dc_k),
        options=(PR_K,) if key in ("precision", "recall") else (DC_K,),
        **verdict,
    )


_FAMILY = PRDC()
PRECISION = _metric(
    "precision",
    why_not="Precision counts generated samples inside the reference manifold, whose k-NN "
    "radii differ between each client and the pool.",
)
RECALL = _metric(
    "recall",
    agrees=EXACT,
    consistent="exact: Recall_all = sum_i (n_i / n) Recall_i (the generated manifold ignores "
    "the clients)",
    breaks={"weights": {"uniform": "Recall_all = sum_i (n_i/n) Recall_i needs weights n_i/n"}},
    # n_i Recall_i counts the site's rows inside the models' k-NN balls (radii from the
    # models alone): replacing a row moves it by at most 1
    secure=WeightedSum("recall", lambda plan: 1.0, unit=lambda bounds, options: 1.0),
)
DENSITY = _metric(
    "density",
    why_not="Density counts generated samples in reference k-NN balls, whose radii differ "
    "between each client and the pool.",
)
COVERAGE = _metric(
    "coverage",
    why_not="Coverage uses the k-NN radii of the reference rows, which differ between each "
    "client and the pool.",
)
