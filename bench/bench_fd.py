"""FD at d=2048: distrank's eigh-based trace vs scipy.linalg.sqrtm, side by side.

    .venv/bin/python bench/bench_fd.py [--d 2048] [--models 4] [--seed 0]

The scipy side is the FID reference formula (pytorch-fid's
``calculate_frechet_distance``): ``sqrtm(C1 @ C2)``, real part, traces. Both sides
get the same float64 statistics; printed: times, ratios and relative differences.
``one pair`` is the cold cost (factor + pair); ``per pair, reused`` is the cost of
each extra model against the same reference, which is what a score grid pays.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import scipy.linalg

from distrank.metrics import GaussianStats, frechet_distance, frechet_distances


def scipy_fd(a: GaussianStats, b: GaussianStats) -> float:
    covmean = scipy.linalg.sqrtm(a.cov @ b.cov)
    covmean = covmean.real
    return float(
        np.sum((a.mean - b.mean) ** 2) + np.trace(a.cov) + np.trace(b.cov) - 2 * np.trace(covmean)
    )


def random_stats(rng, d: int, n: int) -> GaussianStats:
    """Statistics of n Gaussian rows with a random spectrum (a realistic, full-rank cov)."""
    basis = rng.normal(size=(d, 2 * d)) * np.sqrt(rng.gamma(0.5, size=2 * d))
    cov = basis @ basis.T / (2 * d)
    return GaussianStats(n, rng.normal(scale=0.3, size=d), cov)


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--models", type=int, default=4, help="models against one reference")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    ref = random_stats(rng, args.d, 10 * args.d)
    models = [random_stats(rng, args.d, 10 * args.d) for _ in range(args.models)]

    print(f"FD, d={args.d}: scipy.linalg.sqrtm vs distrank (float64)")
    ours_one, t_ours_one = timed(lambda: frechet_distance(ref, models[0]))
    ours_all, t_ours_all = timed(lambda: frechet_distances([ref], models)[0])
    scipy_vals, t_scipy = [], []
    for model in models:
        value, t = timed(lambda model=model: scipy_fd(ref, model))
        scipy_vals.append(value)
        t_scipy.append(t)
    t_scipy = float(np.mean(t_scipy))
    rel = np.abs(ours_all - np.array(scipy_vals)) / np.abs(scipy_vals)
    rel_one = abs(ours_one - scipy_vals[0]) / abs(scipy_vals[0])
    print(f"  scipy sqrtm, per pair          {t_scipy:8.2f} s")
    print(
        f"  distrank, one pair (cold)      {t_ours_one:8.2f} s   ratio {t_scipy / t_ours_one:6.1f}x"
    )
    per_pair = t_ours_all / args.models
    print(
        f"  distrank, per pair, reused     {per_pair:8.2f} s   ratio {t_scipy / per_pair:6.1f}x"
        f"   ({args.models} models vs one reference: {t_ours_all:.2f} s)"
    )
    print(f"  max relative difference        {max(rel.max(), rel_one):.2e}")
    print(f"  FD values                      {np.array2string(np.array(scipy_vals), precision=6)}")


if __name__ == "__main__":
    main()
