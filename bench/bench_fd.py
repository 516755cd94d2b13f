"""FD at d=2048: distrank's eigh-based trace vs scipy.linalg.sqrtm, side by side.

    .venv/bin/python bench/bench_fd.py [--d 2048] [--models 4] [--seed 0]
    .venv/bin/python bench/bench_fd.py --load [--repeats 3]   # one pair, quiet and loaded

The scipy side is the FID reference formula (pytorch-fid's
``calculate_frechet_distance``): ``sqrtm(C1 @ C2)``, real part, traces. Both sides
get the same float64 statistics; printed: times, ratios and relative differences.
``one pair`` is the cold cost (factor + pair); ``per pair, reused`` is the cost of
each extra model against the same reference, which is what a score grid pays.

``--load`` times one pair (statistics given) on a quiet machine and again while the
bench runs two CPU-heavy processes of its own (each a one-thread float64 GEMM loop),
for distrank (every solve on one thread) and for the solver as it was before issue 39
(the same formula, Cholesky and ``eigvalsh`` on the job's threads), alternating.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import scipy.linalg
import torch

from distrank.metrics.fd import GaussianStats, frechet_distance, frechet_distances


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


def threaded_fd(a: GaussianStats, b: GaussianStats) -> float:
    """FD of one full-rank pair as distrank computed it before issue 39: Cholesky, two
    GEMMs and ``eigvalsh`` on torch's threads (MKL's threaded solver), one call at a time."""
    factor = torch.linalg.cholesky(torch.as_tensor(a.cov))
    inner = factor.T @ torch.as_tensor(b.cov) @ factor
    vals = torch.linalg.eigvalsh((inner + inner.T) / 2)
    tol = inner.shape[0] * torch.finfo(vals.dtype).eps * max(float(vals[-1]), 0.0)
    root = float(vals[vals > tol].sqrt().sum())
    traces = float(np.trace(a.cov)) + float(np.trace(b.cov))
    return float(np.sum((a.mean - b.mean) ** 2)) + traces - 2.0 * root


#: A CPU-heavy process: a one-thread float64 GEMM loop.
LOAD = "import numpy as np\na = np.ones((1000, 1000))\nwhile True:\n    a @ a\n"


def one_pair_under_load(ref: GaussianStats, model: GaussianStats, repeats: int) -> None:
    """Median seconds of one pair, quiet and beside two CPU-heavy processes, both solvers."""
    sides = {"distrank, one thread each": frechet_distance, "before (threaded solver)": threaded_fd}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    times = {}
    for phase in ("quiet", "loaded"):
        load = []
        if phase == "loaded":
            load = [subprocess.Popen([sys.executable, "-c", LOAD], env=env) for _ in range(2)]
            time.sleep(2.0)
        try:
            print(f"  {phase}: load average {os.getloadavg()[0]:.1f}", flush=True)
            for _ in range(repeats):
                for name, fn in sides.items():
                    value, t = timed(lambda fn=fn: fn(ref, model))
                    times.setdefault((name, phase), []).append(t)
                    times[name, "value"] = value
        finally:
            for process in load:
                process.kill()
                process.wait()
    print(
        f"\n  one pair, d={len(ref.mean)}, {torch.get_num_threads()} threads, median of {repeats}"
    )
    print(f"  {'':28}{'quiet s':>9}{'loaded s':>10}{'loaded/quiet':>14}")
    for name in sides:
        quiet, loaded = (float(np.median(times[name, p])) for p in ("quiet", "loaded"))
        print(f"  {name:28}{quiet:9.2f}{loaded:10.2f}{loaded / quiet:13.2f}x")
    new, old = (times[name, "value"] for name in sides)
    print(f"  relative difference of the values: {abs(new - old) / abs(old):.2e}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--models", type=int, default=4, help="models against one reference")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--load", action="store_true", help="one pair, quiet and under load")
    p.add_argument("--repeats", type=int, default=3, help="with --load: runs per side")
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    ref = random_stats(rng, args.d, 10 * args.d)
    if args.load:
        one_pair_under_load(ref, random_stats(rng, args.d, 10 * args.d), args.repeats)
        return
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
