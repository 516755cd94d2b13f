"""The full score grid: distrank's one pass vs per-client loops over the reference tools.

    .venv/bin/python bench/bench_grid.py            # M=10 models x K=10 clients, n=10k, d=2048
    .venv/bin/python bench/bench_grid.py --small    # a quick run (M=4, K=4, n=2000, d=256)

Both sides compute KD (poly, unbiased), FD and Precision/Recall/Density/Coverage
(k=5 for all four, as the ``prdc`` package uses one k), each ``all`` (pooled
reference) and ``avg`` (sum_i n_i/n D_i), for every model. The baseline is what one
writes with the reference tools: for each model and each client (and the pool),
torch-fidelity's ``kernel_poly`` kernel matrices with ``mmd2``'s unbiased formula
(generalised to n != m; ``mmd2`` itself asserts square blocks), FID's
``scipy.linalg.sqrtm`` formula on ``np.cov`` statistics, and ``prdc.compute_prdc``.

The baseline is timed on ``--baseline-models`` models and its time scaled to all
models (it repeats the same work per model); values are compared on those models.
distrank runs in float32 (its default) and, for the accuracy line, in float64.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import time

import numpy as np
import pandas as pd
import scipy.linalg
from prdc import compute_prdc
from torch_fidelity.metric_kid import kernel_poly

from distrank.metrics import score

PRDC = ("precision", "recall", "density", "coverage")
K_NN = 5


def make_data(rng, n, m, d, n_models, n_clients, min_rows=0):
    """Heterogeneous clients (own means, Dirichlet sizes) and models of varied fit.

    ``min_rows``: each client first gets that many rows, the rest by the shares.
    """
    centers = rng.normal(scale=0.6, size=(n_clients, d)).astype(np.float32)
    shares = rng.dirichlet(np.full(n_clients, 2.0))
    clients = rng.choice(n_clients, size=n - n_clients * min_rows, p=shares)
    if min_rows:
        clients = rng.permutation(
            np.concatenate([np.repeat(np.arange(n_clients), min_rows), clients])
        )
    x = centers[clients] + rng.standard_normal((n, d), dtype=np.float32)
    models = {}
    for g in range(n_models):
        mix = rng.choice(n_clients, size=m, p=rng.dirichlet(np.full(n_clients, 1.0)))
        scale = rng.uniform(0.7, 1.3)
        models[f"model{g}"] = rng.uniform(0.6, 1.2) * centers[mix] + scale * rng.standard_normal(
            (m, d), dtype=np.float32
        )
    return x, clients, models


def tf_kd(x, y):
    """Unbiased KD from torch-fidelity's KID kernel, with mmd2's formula (n != m allowed)."""
    kxx, kyy, kxy = kernel_poly(x, x), kernel_poly(y, y), kernel_poly(x, y)
    n, m = len(x), len(y)
    return float(
        (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
        + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
        - 2 * kxy.sum() / (n * m)
    )


def scipy_fd(x, y):
    """FID's formula: statistics by np.cov (float64), trace via scipy.linalg.sqrtm."""
    m1, c1 = x.mean(axis=0, dtype=np.float64), np.cov(x, rowvar=False)
    m2, c2 = y.mean(axis=0, dtype=np.float64), np.cov(y, rowvar=False)
    covmean = scipy.linalg.sqrtm(c1 @ c2).real
    return float(np.sum((m1 - m2) ** 2) + np.trace(c1) + np.trace(c2) - 2 * np.trace(covmean))


def baseline(x, clients, y, timings):
    """All and avg of every metric for one model, by per-client calls."""
    labels, sizes = np.unique(clients, return_counts=True)
    lam = sizes / sizes.sum()
    parts = [x] + [x[clients == c] for c in labels]
    out = {}
    for family, fn in (
        ("kd", lambda p: {"kd": tf_kd(p, y)}),
        ("fd", lambda p: {"fd": scipy_fd(p, y)}),
        ("prdc", lambda p: _quiet_prdc(p, y)),
    ):
        start = time.perf_counter()
        values = [fn(p) for p in parts]
        elapsed = time.perf_counter() - start
        timings[family] = timings.get(family, 0.0) + elapsed
        print(f"  baseline {family}: {elapsed:.1f} s", flush=True)
        for metric in values[0]:
            out[metric, "all"] = values[0][metric]
            out[metric, "avg"] = float(lam @ [v[metric] for v in values[1:]])
    return out


def _quiet_prdc(x, y):
    with contextlib.redirect_stdout(io.StringIO()):
        return {k: float(v) for k, v in compute_prdc(x, y, nearest_k=K_NN).items()}


def ours(x, clients, models, dtype, timings):
    tables = []
    for family, metrics in (("kd", ["kd"]), ("fd", ["fd"]), ("prdc", list(PRDC))):
        start = time.perf_counter()
        tables.append(
            score(
                x, clients, models, metrics=metrics, pr_k=K_NN, dc_k=K_NN, dtype=dtype, device="cpu"
            )
        )
        timings[family] = time.perf_counter() - start
        print(f"  distrank {dtype} {family}: {timings[family]:.1f} s", flush=True)
    table = pd.concat(tables)
    pooled = table[table.aggregation != "client"]
    return {(r.model, r.metric, r.aggregation): r.value for r in pooled.itertuples()}


def _arguments(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="M=4, K=4, n=2000, m=500, d=256")
    p.add_argument("--models", type=int, default=10)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--n", type=int, default=10_000, help="reference rows (all clients)")
    p.add_argument("--m", type=int, default=2_000, help="generated rows per model")
    p.add_argument("--d", type=int, default=2048)
    p.add_argument(
        "--baseline-models",
        type=int,
        default=1,
        help="models the baseline runs on (time scaled to all models)",
    )
    p.add_argument("--no-float64", action="store_true", help="skip the float64 accuracy run")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    return small_grid(args)


def small_grid(args: argparse.Namespace) -> argparse.Namespace:
    """``--small``: M=4 x K=4, n=2000, m=500, d=256, the baseline on every model."""
    if args.small:
        args.models, args.clients, args.n, args.m, args.d = 4, 4, 2000, 500, 256
        args.baseline_models = args.models
    return args


def main(argv=None) -> None:
    args = _arguments(argv)
    rng = np.random.default_rng(args.seed)
    x, clients, models = make_data(rng, args.n, args.m, args.d, args.models, args.clients)
    print(
        f"grid: M={args.models} models x K={args.clients} clients, n={args.n}, "
        f"m={args.m}, d={args.d}; load average {os.getloadavg()[0]:.1f}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
    )

    t_ours = {}
    ours32 = ours(x, clients, models, "float32", t_ours)
    ours64 = None if args.no_float64 else ours(x, clients, models, "float64", {})
    sampled = list(models)[: args.baseline_models]
    t_base, base = {}, {}
    for name in sampled:
        for key, value in baseline(x, clients, models[name], t_base).items():
            base[(name, *key)] = value
    scale = args.models / len(sampled)

    print(
        f"\n{'':8}{'distrank s':>12}{'baseline s':>12}{'ratio':>9}   "
        f"(baseline timed on {len(sampled)} model(s), x{scale:g})"
    )
    for family in ("kd", "fd", "prdc"):
        b = t_base[family] * scale
        print(f"{family:8}{t_ours[family]:12.2f}{b:12.2f}{b / t_ours[family]:8.1f}x")
    total_o, total_b = sum(t_ours.values()), sum(t_base.values()) * scale
    print(f"{'total':8}{total_o:12.2f}{total_b:12.2f}{total_b / total_o:8.1f}x")

    print("\nmax relative difference (all and avg, sampled models):")
    for metric in ("kd", "fd") + PRDC:
        keys = [k for k in base if k[1] == metric]
        rel32 = max(_rel(ours32[k], base[k]) for k in keys)
        line = f"  {metric:10} float32 vs baseline {rel32:9.2e}"
        if ours64 is not None:
            rel64 = max(_rel(ours64[k], base[k]) for k in keys)
            acc = max(_rel(ours32[k], ours64[k]) for k in ours64 if k[1] == metric)
            line += f"   float64 vs baseline {rel64:9.2e}   float32 vs float64 {acc:9.2e}"
        print(line)

    print("\nTheorem 1: spread of KD_avg - KD_all across models, relative to max |KD|:")
    for dtype, values in (("float32", ours32), ("float64", ours64)):
        if values is not None:
            gaps = np.array([values[g, "kd", "avg"] - values[g, "kd", "all"] for g in models])
            kd = max(abs(values[g, "kd", a]) for g in models for a in ("all", "avg"))
            print(f"  {dtype}: gap {gaps.mean():.6g}, spread {np.ptp(gaps) / kd:.2e}")


def _rel(a, b):
    return abs(a - b) / max(abs(b), 1e-300)


if __name__ == "__main__":
    main()
