"""KD from kernel mean sketches: its family and its metric (``kd_sketch``).

The rbf kernel's KD through random Fourier features (:mod:`distrank.metrics.sketch`):
the pooled reference, each client and each model are sketched once with the public map
of (``seed``, d, :data:`DIM`, the rbf ``bandwidth``), and every value is the U-statistic
of the sketched kernel (``sketch._maps.sketch_kd``). The sketched kernel is a kernel, so
Theorem 1 holds for it: ``avg`` is ``all`` plus a model-free offset under size weights.
Its secure sum (Flower's secure mode, :class:`SketchSum`) is the sum of the sites'
n_i s_i: the server learns the pooled sketch, from which it scores any model, and the
sites need no model. Other sketch dimensions and private releases: the library,
``distrank sketch`` and ``distrank rank``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from distrank.metrics._family import Family, Inputs, Run, SecureSum, Values
from distrank.metrics._metric import SAFE, Metric, Rows

#: the sketch dimension of the ``kd_sketch`` metric
DIM = 4096


def feature_map(options, dim: int):
    """The public map of a scoring call: rbf only, its bandwidth resolved, ``options.seed``."""
    from distrank.metrics.sketch._maps import FeatureMap

    if options.kernel != "rbf":
        raise ValueError(
            f"kd_sketch: the sketch is of the rbf kernel; got kernel {options.kernel!r}"
        )
    return FeatureMap(dim, DIM, float(options.kernel_params["bandwidth"]), options.seed)


class KDSketch(Family):
    uses_kernel = True  # the rbf bandwidth, resolved by the scorer

    def plain(self, inputs: Inputs, keys: Sequence[str]) -> Run:
        from distrank.metrics.sketch._maps import sketch_kd

        def compute() -> Values:
            x = inputs.reference.double().cpu().numpy()
            fmap = feature_map(inputs.options, x.shape[1])
            pooled = fmap.sketch(x)
            clients = [
                fmap.sketch(x[inputs.groups.rows(c)]) for c in range(len(inputs.groups.names))
            ]
            out = {}
            for name, y in inputs.models.items():
                t = fmap.sketch(y.double().cpu().numpy())
                local = np.array([sketch_kd(s, t) for s in clients])
                out[name] = {"kd_sketch": (sketch_kd(pooled, t), local)}
            return out

        return Run(compute)


class SketchSum(SecureSum):
    """A site adds n_i s_i (its sketch of the plan's public map); ``all`` is every model's
    KD from the pooled sketch sum_i n_i s_i / n. An entry of n_i s_i is at most
    n_i sqrt(2 / D); replacing a row moves n_i s_i by at most 2 in L2 (``|phi| = 1``), for
    every model at once."""

    def sensitivity(self, plan, bounds, options) -> dict[str, float | None]:
        return {"sketch": 2.0}

    def blocks(self, plan):
        return [("sketch", DIM, plan.max_rows * math.sqrt(2.0 / DIM))]

    def site(self, plan, x, scores, centre, device=None):
        return [len(x) * plan_map(plan).sketch(x).mean]

    def finish(self, plan, sums, n, k, centre, models, errors, device=None):
        from distrank.metrics.sketch._maps import sketch_kd

        fmap, pooled = plan_map(plan), pooled_sketch(plan, sums, n)
        values = np.array([sketch_kd(pooled, fmap.sketch(np.asarray(y))) for y in models.values()])
        # |error of s| <= e sqrt(D) / n; KD moves by at most (4 n / (n - 1)) |error| + |error|^2
        shift = errors["sketch"] * math.sqrt(DIM) / n
        return {"all": (values, np.full(len(values), 4 * shift * n / (n - 1) + shift**2))}

    def value_noise(self, plan, models, std: float, n: int, k: int):
        """-2 t.eta, t the model's sketch and eta the pooled sketch's noise (std sigma =
        ``std`` / n per entry): std ``2 |t| sigma`` (``|eta|^2`` shifts every model alike)."""
        fmap = plan_map(plan)
        return np.array(
            [2 * np.linalg.norm(fmap.sketch(np.asarray(y)).mean) * std / n for y in models.values()]
        )


def plan_map(plan):
    """The public feature map of a secure plan (its dim, seed and bandwidth)."""
    from distrank.metrics.sketch._maps import FeatureMap

    return FeatureMap(plan.dim, DIM, plan.bandwidth, plan.seed)


def pooled_sketch(plan, sums, n: int):
    """The pooled sketch of a secure sum."""
    from distrank.metrics.sketch._maps import Sketch

    return Sketch(sums["sketch"] / n, n, plan_map(plan).meta())


KD_SKETCH = Metric(
    "kd_sketch",
    "KD-sketch",
    False,
    KDSketch(),
    lambda o: Rows(2, 2, "the sketched KD (U-statistic)"),
    agrees=SAFE,
    consistent="Theorem 1 for the sketched kernel: KD_avg = KD_all + a model-free offset",
    breaks={
        "weights": {
            "uniform": "Theorem 1 needs weights n_i/n; with uniform weights the gap "
            "KD_avg - KD_all depends on the model"
        }
    },
    secure=SketchSum(),
    needs_models=False,  # each site's sketch scores every model, now or later
)
