"""Benchmark of distrank's blocked PRDC (a script, not a test).

(a) scale: n reference rows and n generated rows (default 50k each), d=1024, 10
    clients: wall time and peak RSS, which must stay under 4 GiB (prdc's dense
    n x n float32 matrices alone would take 3 x 10 GB at n=50k).
(b) versus the prdc package (Naeem et al.) at n=10k per side: time of one
    distrank call (pooled and every client, pr_k=dc_k=k) against prdc.compute_prdc
    on the pool, their ratio, and the largest difference of the four values.
    With --compare-clients, prdc is also looped over the clients, as a user of prdc
    would do to get the per-client values that distrank returns in the same call.

    .venv/bin/python bench/bench_prdc.py                  # both parts
    .venv/bin/python bench/bench_prdc.py --part a --n 5000
    .venv/bin/python bench/bench_prdc.py --part b --compare-n 2000 --compare-clients
"""

import argparse
import contextlib
import io
import resource
import time

import numpy as np
import torch

from distrank.metrics.prdc._scores import METRICS, prdc

GIB = 2**30


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def features(n: int, d: int, n_clients: int, seed: int):
    """A non-iid reference (one shifted Gaussian per client) and a model that drops
    the modes of 30 % of the clients (mid-range values of all four metrics)."""
    rng = np.random.default_rng(seed)
    clients = rng.integers(0, n_clients, n)
    centers = rng.normal(0.0, 1.0, (n_clients, d)).astype(np.float32)
    reference = rng.standard_normal((n, d), dtype=np.float32)
    reference += centers[clients]
    kept = rng.integers(0, max(1, int(0.7 * n_clients)), n)
    model = rng.standard_normal((n, d), dtype=np.float32)
    model += centers[kept]
    return reference, clients, model


def part_a(args) -> None:
    reference, clients, model = features(args.n, args.d, args.clients, seed=0)
    data_rss = peak_rss_bytes()
    start = time.perf_counter()
    result = prdc(reference, clients, {"model": model}, device=args.device)
    wall = time.perf_counter() - start
    peak = peak_rss_bytes()
    print(
        f"(a) n=m={args.n}, d={args.d}, clients={args.clients}, float32, "
        f"threads={torch.get_num_threads()}, device={args.device or 'cpu'}"
    )
    print(
        f"    wall {wall:.1f} s; peak RSS {peak / GIB:.2f} GiB "
        f"(inputs {2 * reference.nbytes / GIB:.2f} GiB; RSS before the call {data_rss / GIB:.2f} GiB)"
        f" -> {'OK' if peak < 4 * GIB else 'FAIL'} (< 4 GiB)"
    )
    print("    all:", {metric: round(v["all"], 4) for metric, v in result["model"].items()})


def naeem(real, fake, k):
    import prdc as reference_prdc

    with contextlib.redirect_stdout(io.StringIO()):
        return reference_prdc.compute_prdc(real, fake, nearest_k=k)


def part_b(args) -> None:
    n, d, k = args.compare_n, args.compare_d, args.k
    reference, clients, model = features(n, d, args.clients, seed=1)
    print(f"(b) n=m={n}, d={d}, clients={args.clients}, k={k} for all four metrics")

    runs = {}
    for dtype in ("float32", "float64"):
        start = time.perf_counter()
        runs[dtype] = prdc(
            reference, clients, {"model": model}, pr_k=k, dc_k=k, dtype=dtype, device=args.device
        )["model"]
        runs[dtype + " time"] = time.perf_counter() - start

    start = time.perf_counter()
    pooled = naeem(reference, model, k)
    prdc_time = time.perf_counter() - start
    print(f"    prdc.compute_prdc, pool only:      {prdc_time:7.1f} s")
    for dtype in ("float32", "float64"):
        diff = max(abs(runs[dtype][metric]["all"] - float(pooled[metric])) for metric in METRICS)
        print(
            f"    distrank {dtype}, pool + clients: {runs[dtype + ' time']:7.1f} s  "
            f"(prdc/distrank {prdc_time / runs[dtype + ' time']:.1f}x); "
            f"max |diff| on the pool {diff:.2e}"
        )

    if args.compare_clients:
        start = time.perf_counter()
        diffs = {"float32": 0.0, "float64": 0.0}
        for label in np.unique(clients):
            values = naeem(reference[clients == label], model, k)
            for dtype in diffs:
                diffs[dtype] = max(
                    diffs[dtype],
                    *(
                        abs(runs[dtype][metric][str(label)] - float(values[metric]))
                        for metric in METRICS
                    ),
                )
        loop_time = prdc_time + time.perf_counter() - start
        print(
            f"    prdc looped over pool + {args.clients} clients: {loop_time:7.1f} s "
            f"(prdc/distrank float32 {loop_time / runs['float32 time']:.1f}x, "
            f"float64 {loop_time / runs['float64 time']:.1f}x); max |diff| over clients: "
            f"float32 {diffs['float32']:.2e}, float64 {diffs['float64']:.2e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=["a", "b", "all"], default="all")
    parser.add_argument("--n", type=int, default=50_000, help="(a) rows per side")
    parser.add_argument("--d", type=int, default=1024, help="(a) feature dimension")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--compare-n", type=int, default=10_000, help="(b) rows per side")
    parser.add_argument("--compare-d", type=int, default=1024, help="(b) feature dimension")
    parser.add_argument("--k", type=int, default=5, help="(b) nearest_k of prdc")
    parser.add_argument(
        "--compare-clients", action="store_true", help="(b) also loop prdc over the clients"
    )
    parser.add_argument("--device", default=None, help="torch device, e.g. cuda")
    args = parser.parse_args()
    if args.part in ("a", "all"):
        part_a(args)
    if args.part in ("b", "all"):
        part_b(args)


if __name__ == "__main__":
    main()
