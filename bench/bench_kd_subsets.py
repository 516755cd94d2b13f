"""KD in KID's subset mode on the grid of ``bench_grid.py``: distrank vs each peer's KID loop.

    .venv/bin/python bench/bench_kd_subsets.py --small   # M=4 x K=4, n=2000, m=500, d=256
    .venv/bin/python bench/bench_kd_subsets.py           # M=10 x K=10, n=10k, m=2000, d=2048

distrank scores every model against the pool and every client with
``kd_estimator="subsets"`` (``n_subsets`` subsets of ``subset_size`` rows, seeded).
Each peer computes KID the way its package does, once per (model, part) pair, for
the pool and each client:

- torch-fidelity: ``kid_features_to_metric`` (numpy, float64 kernels, seeded draws);
- clean-fid: ``cleanfid.fid.kernel_distance`` (numpy, draws from the seeded global RNG);
- torchmetrics: ``KernelInceptionDistance.compute`` on features (torch, ``randperm`` draws);
- dgm-eval's loop (the package is not on PyPI): per subset, scikit-learn's
  ``polynomial_kernel`` and the unbiased MMD^2, draws from ``numpy.random.choice``.

A peer that does not import is skipped. torch-fidelity and clean-fid draw the same
subsets as distrank for the same seed, so their values are compared; torchmetrics
draws other subsets (compared only as a mean). Peers are timed on
``--baseline-models`` models and their time scaled to all models.

Every part needs ``subset_size`` rows, so the clients are drawn as in ``bench_grid``
(Dirichlet shares) on top of a floor of ``subset_size`` rows each (``make_data``'s
``min_rows``); with ``--small`` that floor takes all 2,000 rows (4 clients of 500).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import time

import numpy as np
import torch
from bench_grid import make_data, small_grid

from distrank.metrics import score


def tf_kid(x, y, args):
    from torch_fidelity.metric_kid import kid_features_to_metric

    out = kid_features_to_metric(
        torch.from_numpy(y),
        torch.from_numpy(x),
        kid_subsets=args.subsets,
        kid_subset_size=args.subset_size,
        rng_seed=args.seed,
        verbose=False,
    )
    return out["kernel_inception_distance_mean"]


def cleanfid_kid(x, y, args):
    from cleanfid.fid import kernel_distance

    np.random.seed(args.seed)  # clean-fid draws from the global RNG: feats2 (Y) first
    return kernel_distance(x, y, num_subsets=args.subsets, max_subset_size=args.subset_size)


def torchmetrics_kid(x, y, args):
    from torchmetrics.image.kid import KernelInceptionDistance

    torch.manual_seed(args.seed)
    with contextlib.redirect_stderr(io.StringIO()):
        kid = KernelInceptionDistance(
            feature=torch.nn.Identity(), subsets=args.subsets, subset_size=args.subset_size
        )
    kid.update(torch.from_numpy(x), real=True)
    kid.update(torch.from_numpy(y), real=False)
    return float(kid.compute()[0])


def dgm_eval_kid(x, y, args):
    """dgm-eval's ``compute_mmd``: sklearn's polynomial kernel per subset, unbiased MMD^2."""
    from sklearn.metrics.pairwise import polynomial_kernel

    np.random.seed(args.seed)
    s, values = args.subset_size, []
    for _ in range(args.subsets):
        g = x[np.random.choice(len(x), s, replace=False)]
        r = y[np.random.choice(len(y), s, replace=False)]
        kxx, kyy, kxy = polynomial_kernel(g), polynomial_kernel(r), polynomial_kernel(g, r)
        within = kxx.sum() - np.trace(kxx) + kyy.sum() - np.trace(kyy)
        values.append(within / (s * (s - 1)) - 2 * kxy.sum() / s**2)
    return float(np.mean(values))


PEERS = {
    "torch-fidelity": tf_kid,
    "clean-fid": cleanfid_kid,
    "torchmetrics": torchmetrics_kid,
    "dgm-eval": dgm_eval_kid,
}
SAME_DRAWS = ("torch-fidelity", "clean-fid")


def available_peers(names):
    out = {}
    for name in names:
        probe = np.zeros((4, 2), dtype=np.float32)
        probe_x = probe + np.arange(4, dtype=np.float32)[:, None]
        try:
            args = argparse.Namespace(subsets=1, subset_size=2, seed=0)
            PEERS[name](probe_x, probe, args)
        except ImportError as error:
            print(f"  {name}: skipped ({error})")
            continue
        out[name] = PEERS[name]
    return out


def ours(x, clients, models, args):
    start = time.perf_counter()
    table = score(
        x,
        clients,
        models,
        metrics=["kd"],
        kd_estimator="subsets",
        n_subsets=args.subsets,
        subset_size=args.subset_size,
        seed=args.seed,
        dtype=args.dtype,
        device="cpu",
    )
    elapsed = time.perf_counter() - start
    kd = table[(table.metric == "kd") & (table.aggregation != "avg")]
    return elapsed, {(r.model, r.client): r.value for r in kd.itertuples()}


def peer_run(fn, x, clients, models, names, args):
    parts = {"": x} | {str(c): x[clients == c] for c in np.unique(clients)}
    start, values = time.perf_counter(), {}
    for name in names:
        for key, part in parts.items():
            values[name, key] = fn(part, models[name], args)
    return time.perf_counter() - start, values


def _arguments(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="M=4, K=4, n=2000, m=500, d=256")
    p.add_argument("--models", type=int, default=10)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--m", type=int, default=2_000)
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--subsets", type=int, default=100)
    p.add_argument("--subset-size", type=int, default=500)
    p.add_argument("--baseline-models", type=int, default=1)
    p.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    return small_grid(args)


def main(argv=None) -> None:
    args = _arguments(argv)
    rng = np.random.default_rng(args.seed)
    x, clients, models = make_data(
        rng, args.n, args.m, args.d, args.models, args.clients, min_rows=args.subset_size
    )
    print(
        f"grid: M={args.models} x K={args.clients}, n={args.n}, m={args.m}, d={args.d}; "
        f"{args.subsets} subsets of {args.subset_size}; client rows {np.bincount(clients)}; "
        f"load average {os.getloadavg()[0]:.1f}; torch threads {torch.get_num_threads()}"
    )
    peers = available_peers(args.peers)
    t_ours, values = ours(x, clients, models, args)
    print(f"  distrank {args.dtype}: {t_ours:.2f} s", flush=True)
    sampled = list(models)[: args.baseline_models]
    scale = args.models / len(sampled)
    print(f"\n{'':16}{'time s':>10}{'ratio':>9}   (peers timed on {len(sampled)} model(s))")
    print(f"{'distrank':16}{t_ours:10.2f}{1:8.1f}x")
    for name, fn in peers.items():
        elapsed, theirs = peer_run(fn, x, clients, models, sampled, args)
        elapsed *= scale
        diff = max(abs(values[k] - v) / abs(v) for k, v in theirs.items())
        tag = "same draws" if name in SAME_DRAWS else "other draws"
        print(
            f"{name:16}{elapsed:10.2f}{elapsed / t_ours:8.1f}x"
            f"   max rel. difference {diff:.2e} ({tag})",
            flush=True,
        )


if __name__ == "__main__":
    main()
