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
Beside them run the fastest peer loops we know, written here from the peers' formulas:
KD with the same kernel as torch matmuls (torchmetrics' KID), and FD as the square
roots of the eigenvalues of the covariance product in torch (torchmetrics' FID). The
ratio of a family is against its fastest peer.

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
import scipy.linalg
import torch
from prdc import compute_prdc
from torch_fidelity.metric_kid import kernel_poly

from distrank.metrics import score

PRDC = ("precision", "recall", "density", "coverage")
METRICS = ("kd", "fd", *PRDC)  # the whole grid, in one call
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


def torch_kd(x, y):
    """Unbiased KD with the same kernel, ``(x y^T / d + 1)^3``, as torch float32 matmuls."""
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    d, n, m = x.shape[1], len(x), len(y)

    def off_diagonal_mean(a):
        k = (a @ a.T / d + 1) ** 3
        return (k.sum() - k.diagonal().sum()).item() / (n * (n - 1) if a is x else m * (m - 1))

    cross = ((x @ y.T / d + 1) ** 3).sum().item()
    return off_diagonal_mean(x) + off_diagonal_mean(y) - 2 * cross / (n * m)


def torch_eig_fd(x, y):
    """FD from the eigenvalues of the covariance product, ``sum sqrt(eig(C_x C_y))``, in
    torch float64 (torchmetrics' formula): one general eigenproblem a pair."""
    (m1, c1), (m2, c2) = (
        (a.mean(dim=0), torch.cov(a.T))
        for a in (torch.from_numpy(x).double(), torch.from_numpy(y).double())
    )
    root = torch.linalg.eigvals(c1 @ c2).sqrt().real.sum()
    return float((m1 - m2).square().sum() + c1.trace() + c2.trace() - 2 * root)


def scipy_fd(x, y):
    """FID's formula: statistics by np.cov (float64), trace via scipy.linalg.sqrtm."""
    m1, c1 = x.mean(axis=0, dtype=np.float64), np.cov(x, rowvar=False)
    m2, c2 = y.mean(axis=0, dtype=np.float64), np.cov(y, rowvar=False)
    covmean = scipy.linalg.sqrtm(c1 @ c2).real
    return float(np.sum((m1 - m2) ** 2) + np.trace(c1) + np.trace(c2) - 2 * np.trace(covmean))


#: family -> peer -> one client's (or the pool's) scores; the first peer is the reference
#: tool that the values are compared with.
PEERS = {
    "kd": {"torch-fidelity": tf_kd, "torch matmul": torch_kd},
    "fd": {"scipy sqrtm": scipy_fd, "torch eigvals": torch_eig_fd},
    "prdc": {"prdc": None},
}


def baseline(x, clients, y, timings):
    """All and avg of every metric for one model, by per-client calls of every peer;
    ``timings[family, peer]`` accumulates, the values are the reference tool's."""
    labels, sizes = np.unique(clients, return_counts=True)
    lam = sizes / sizes.sum()
    parts = [x] + [x[clients == c] for c in labels]
    out = {}
    for family, peers in PEERS.items():
        for peer, fn in peers.items():
            start = time.perf_counter()
            values = [_quiet_prdc(p, y) if family == "prdc" else {family: fn(p, y)} for p in parts]
            elapsed = time.perf_counter() - start
            timings[family, peer] = timings.get((family, peer), 0.0) + elapsed
            print(f"  {peer} {family}: {elapsed:.1f} s", flush=True)
            for metric in values[0]:
                value = (values[0][metric], float(lam @ [v[metric] for v in values[1:]]))
                for aggregation, v in zip(("all", "avg"), value):
                    out.setdefault((metric, aggregation), {})[peer] = v
    return out


def _quiet_prdc(x, y):
    with contextlib.redirect_stdout(io.StringIO()):
        return {k: float(v) for k, v in compute_prdc(x, y, nearest_k=K_NN).items()}


def ours(x, clients, models, dtype, timings, alone=True):
    """Every metric in one ``score`` call (as the pipeline and users call it: KD and PRDC
    share their products), then (``alone``) each family alone; the values are the one
    call's."""
    families = {"kd": ["kd"], "fd": ["fd"], "prdc": list(PRDC)} if alone else {}
    for family, metrics in {"grid": list(METRICS), **families}.items():
        start = time.perf_counter()
        table = score(
            x, clients, models, metrics=metrics, pr_k=K_NN, dc_k=K_NN, dtype=dtype, device="cpu"
        )
        timings[family] = time.perf_counter() - start
        print(f"  distrank {dtype} {family}: {timings[family]:.1f} s", flush=True)
        if family == "grid":
            pooled = table[table.aggregation != "client"]
    return {(r.model, r.metric, r.aggregation): r.value for r in pooled.itertuples()}


def warm_up(x, clients, models):
    """One call on 20 rows of each client and 50 of each model: libraries loaded, threads
    started."""
    rows = np.concatenate([np.flatnonzero(clients == c)[:20] for c in np.unique(clients)])
    warm = {name: y[:50] for name, y in models.items()}
    score(x[rows], clients[rows], warm, metrics=list(METRICS), pr_k=K_NN, dc_k=K_NN)


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

    warm_up(x, clients, models)
    t_ours = {}
    ours32 = ours(x, clients, models, "float32", t_ours)
    ours64 = None if args.no_float64 else ours(x, clients, models, "float64", {}, alone=False)
    sampled = list(models)[: args.baseline_models]
    t_base, peers = {}, {}
    for name in sampled:
        for key, by_peer in baseline(x, clients, models[name], t_base).items():
            peers[(name, *key)] = by_peer
    base = {key: next(iter(by_peer.values())) for key, by_peer in peers.items()}  # reference
    scale = args.models / len(sampled)

    print(
        f"\n{'':8}{'distrank s':>12}  peers' s (timed on {len(sampled)} model(s), x{scale:g})"
        f"{'fastest/ours':>28}"
    )
    fastest = {}
    for family in PEERS:
        times = {peer: t_base[family, peer] * scale for peer in PEERS[family]}
        fastest[family] = min(times.values())
        cells = ", ".join(f"{peer} {t:.2f}" for peer, t in times.items())
        print(
            f"{family:8}{t_ours[family]:12.2f}  {cells:40}{fastest[family] / t_ours[family]:8.1f}x"
        )
    total_o, total_b = t_ours["grid"], sum(fastest.values())
    print(
        f"{'grid':8}{total_o:12.2f}  {'fastest peer per family ' + f'{total_b:.2f}':40}"
        f"{total_b / total_o:8.1f}x\n(grid: every metric in one call; the families' own calls "
        f"sum to {sum(t_ours[f] for f in PEERS):.2f} s)"
    )
    print("\npeers against the reference tool (max relative difference):")
    for key in sorted({k[1:] for k in peers}):
        by_peer = [peers[(g, *key)] for g in sampled]
        for peer in list(PEERS.get(key[0], {}))[1:]:
            rel = max(_rel(p[peer], next(iter(p.values()))) for p in by_peer)
            print(f"  {key[0]:10} {key[1]:4} {peer:14} {rel:9.2e}")

    print("\nmax relative difference (all and avg, sampled models):")
    for metric in METRICS:
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
