"""KD kernel sums: throughput as a fraction of numpy's SGEMM, measured in the same run.

    .venv/bin/python bench/bench_kd_gemm.py [--n 8192] [--m 8192] [--d 2048] [--clients 10]

Both sides are timed alternately (best of ``--repeats``). The SGEMM reference is
numpy's float32 ``A @ B.T`` of one (block x d) by (d x block) product; torch's own
``torch.mm`` of the same shapes (the GEMM distrank calls) is printed beside it. distrank's
rate counts 2 d flops per kernel entry it actually forms (S_XX and S_YY from the
blocks on and above the diagonal, S_XY in full); the rest of its time is the
kernel's element-wise work, the per-client sums and float64 accumulation.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch

from distrank.metrics import make_kernel
from distrank.metrics.kd import kernel_sums


def entries_formed(n: int, block: int) -> int:
    """Kernel entries in the blocks on and above the diagonal of an n x n block grid."""
    edges = list(range(0, n, block)) + [n]
    sizes = np.diff(edges)
    return int(sum(sizes[a] * sizes[b] for a in range(len(sizes)) for b in range(a, len(sizes))))


def _arguments(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=8192, help="reference rows")
    p.add_argument("--m", type=int, default=8192, help="generated rows (one model)")
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--block-size", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kernel", default="poly")
    args = p.parse_args(argv)
    return args


def main(argv=None) -> None:
    args = _arguments(argv)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((args.n, args.d), dtype=np.float32))
    y = torch.from_numpy(rng.standard_normal((args.m, args.d), dtype=np.float32) + 0.1)
    clients = rng.integers(0, args.clients, size=args.n)
    kernel = make_kernel(
        args.kernel,
        {"bandwidth": float(np.sqrt(2 * args.d))} if args.kernel in ("rbf", "laplace") else None,
        args.d,
    )
    b = args.block_size
    a_np, b_np = x[:b].numpy().copy(), y[:b].numpy().copy()
    flops_gemm = 2 * a_np.shape[0] * b_np.shape[0] * args.d
    entries = entries_formed(args.n, b) + args.n * args.m + entries_formed(args.m, b)
    flops_kd = 2 * args.d * entries

    print(
        f"torch threads {torch.get_num_threads()}, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS')}, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"KD sums, {args.kernel} kernel, n={args.n} ({args.clients} clients), m={args.m}, "
        f"d={args.d}, block {b}, float32 products / float64 sums"
    )
    a_np @ b_np.T  # warm up
    kernel_sums(x[:b], clients[:b], [y[:b]], kernel, block_size=b, device="cpu")
    a_t, b_t = torch.from_numpy(a_np), torch.from_numpy(b_np)
    t_gemm, t_torch, t_kd = [], [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(3):
            a_np @ b_np.T
        t_gemm.append((time.perf_counter() - start) / 3)
        start = time.perf_counter()
        for _ in range(3):
            torch.mm(a_t, b_t.T)
        t_torch.append((time.perf_counter() - start) / 3)
        start = time.perf_counter()
        kernel_sums(x, clients, [y], kernel, block_size=b, device="cpu")
        t_kd.append(time.perf_counter() - start)
    gemm_rate = flops_gemm / min(t_gemm) / 1e9
    torch_rate = flops_gemm / min(t_torch) / 1e9
    kd_rate = flops_kd / min(t_kd) / 1e9
    print(f"  numpy SGEMM ({b}x{args.d} @ {args.d}x{b})   {gemm_rate:8.1f} GFLOP/s")
    print(f"  torch.mm, same shapes                {torch_rate:8.1f} GFLOP/s")
    print(
        f"  distrank kernel_sums                 {kd_rate:8.1f} GFLOP/s   "
        f"({min(t_kd):.2f} s for {entries / 1e6:.0f} M kernel entries)"
    )
    print(f"  fraction of numpy SGEMM              {kd_rate / gemm_rate:8.1%}")
    print(f"  fraction of torch.mm SGEMM           {kd_rate / torch_rate:8.1%}")
    dense = 2 * args.d * (args.n**2 + args.n * args.m + args.m**2)
    print(
        f"  (dense-equivalent rate, counting the mirrored blocks too: "
        f"{dense / min(t_kd) / 1e9:.1f} GFLOP/s)"
    )


if __name__ == "__main__":
    main()
