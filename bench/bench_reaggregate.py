"""E8's engine: many partitions scored from shared sums vs distrank.metrics.score afresh.

    .venv/bin/python bench/bench_reaggregate.py [--small] [--n 5000] [--d 1280]
        [--models 14] [--m 1000] [--partitions 6] [--dtype float64] [--seed 0]

Both sides score the same models against the same reference rows under the same
partitions (Dirichlet label skew over blocks of 10 rows of one class, as E8 draws
them; 10 clients), all six metrics, both aggregations. ``afresh`` is one
``distrank.metrics.score`` call per partition (what a loop over partitions costs);
``re-aggregated`` is one ``distrank.metrics._reaggregate.score_partitions`` call.
Printed: both times, the ratio, and the largest relative difference per metric.
The default size is the default study's E8 (n = 5000 reference rows, d = 1280
EfficientNet-Lite0 features, 14 models of 1000 rows) at 6 of its 31 partitions.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from distrank.experiments.e8_heterogeneity import draw_partitions
from distrank.metrics import score
from distrank.metrics._reaggregate import score_partitions


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="n=2000, d=256, 6 models of 500")
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--d", type=int, default=1280)
    p.add_argument("--models", type=int, default=14)
    p.add_argument("--m", type=int, default=1000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.small:
        args.n, args.d, args.models, args.m = 2000, 256, 6, 500
    rng = np.random.default_rng(args.seed)
    labels = np.arange(args.n) % 10
    means = 2.0 * rng.standard_normal((10, args.d))
    x = (means[labels] + rng.standard_normal((args.n, args.d))).astype(np.float32)
    models = {
        f"g{i}": (
            (1 - 0.05 * i) * means[rng.integers(0, 10, args.m)]
            + (0.5 + 0.1 * i) * rng.standard_normal((args.m, args.d))
        ).astype(np.float32)
        for i in range(args.models)
    }
    alphas = [1000, 10, 1, 0.3, 0.1, 0.03]
    parts, _ = draw_partitions(
        labels,
        n_clients=10,
        alphas=alphas,
        one_class=False,
        seeds=-(-args.partitions // len(alphas)),
        block_rows=10,
        min_rows=10,
        seed=args.seed,
    )
    parts = dict(list(parts.items())[: args.partitions])

    print(
        f"{len(parts)} partitions x {args.models} models: n={args.n}, m={args.m}, "
        f"d={args.d}, {args.dtype}, 10 clients each"
    )
    shared, t_shared = timed(lambda: score_partitions(x, parts, models, dtype=args.dtype))
    afresh, t_afresh = {}, 0.0
    for name, clients in parts.items():
        afresh[name], t = timed(lambda c=clients: score(x, c, models, dtype=args.dtype))
        t_afresh += t
    print(
        f"  afresh (score per partition)   {t_afresh:8.1f} s  "
        f"({t_afresh / len(parts):.2f} s a partition)"
    )
    print(
        f"  re-aggregated (score_partitions) {t_shared:6.1f} s  "
        f"({t_shared / len(parts):.2f} s a partition)"
    )
    print(f"  speed-up {t_afresh / t_shared:.1f}x")
    worst = {}
    for name, table in afresh.items():
        got = shared[shared.partition == name].reset_index(drop=True)
        for metric in table["metric"].unique():
            a = got.loc[got.metric == metric, "value"].to_numpy()
            b = table.loc[table.metric == metric, "value"].to_numpy()
            rel = np.max(np.abs(a - b) / np.maximum(np.abs(b), np.finfo(float).tiny))
            worst[metric] = max(worst.get(metric, 0.0), float(rel))
    print("  max relative difference: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))


if __name__ == "__main__":
    main()
