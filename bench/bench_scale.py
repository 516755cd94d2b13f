"""Consortium-scale benchmark: all six metrics, pooled (all) and client average (avg).

Synthetic float32 features: n reference rows split into K clients of Dirichlet(1)
sizes (one Gaussian cluster per client), M models of m rows each, dimension d. Every
stage runs in its own process, which reports its wall time and peak RSS (the
``ru_maxrss`` of that process alone, import of torch included):

    data      write reference.npz (features, clients) and model_<g>.npz
    api       distrank.metrics.score(...) on the loaded arrays, all six metrics in one call
    cli       distrank score --reference reference.npz --model g=model_g.npz ... (all six)
    kd        score(..., metrics=["kd"])          each family alone, for the cost model
    fd        score(..., metrics=["fd"])
    prdc      score(..., metrics=[precision, recall, density, coverage])

The default stages are data, api and cli; the CLI's table is compared with the API's
(largest relative difference). In one call KD's kernel sums come from PRDC's
products, so ``api`` costs less than ``kd + fd + prdc``. Sizes are ``n,K,M,m,d``; the
cost model of bench/README.md is fitted from the per-family JSON lines.

    .venv/bin/python bench/bench_scale.py --quick                 # ~1-2 min
    .venv/bin/python bench/bench_scale.py                         # n=100k, K=100, M=10, m=10k, d=2048
    .venv/bin/python bench/bench_scale.py --stages data kd fd prdc --sizes 10000,10,4,2000,512
    .venv/bin/python bench/bench_scale.py --fit bench/results/scale.jsonl   # the cost model
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FULL = (100_000, 100, 10, 10_000, 2048)
QUICK = (4_000, 8, 3, 1_000, 128)
STAGES = ("data", "api", "cli", "kd", "fd", "prdc")
PRDC = ["precision", "recall", "density", "coverage"]
GIB = 2**30


def client_sizes(n: int, k: int, rng, min_rows: int = 20) -> np.ndarray:
    """Dirichlet(1) shares of n rows, every client at least ``min_rows``."""
    if n < k * min_rows:
        raise ValueError(f"sizes: n={n} cannot give {k} clients {min_rows} rows each")
    return rng.multinomial(n - k * min_rows, rng.dirichlet(np.ones(k))) + min_rows


def write_data(size, out: Path, seed: int = 0) -> None:
    """Clustered reference (one Gaussian per client) and models that cover part of
    the clusters with different spreads; float32 npz files, generated in row chunks."""
    n, k, n_models, m, d = size
    rng = np.random.default_rng(seed)
    clients = np.repeat(np.arange(k), client_sizes(n, k, rng))
    rng.shuffle(clients)
    centers = rng.standard_normal((k, d), dtype=np.float32)
    x = np.empty((n, d), dtype=np.float32)
    for r0 in range(0, n, 8192):
        part = clients[r0 : r0 + 8192]
        x[r0 : r0 + len(part)] = centers[part] + rng.standard_normal((len(part), d), np.float32)
    np.savez(out / "reference.npz", features=x, clients=clients)
    del x
    for g in range(n_models):
        modes = rng.integers(0, max(1, k - g * k // (2 * n_models)), m)
        spread = np.float32(0.6 + 0.1 * g)
        y = centers[modes] + spread * rng.standard_normal((m, d), dtype=np.float32)
        np.savez(out / f"model_g{g}.npz", features=y)


def load(out: Path):
    with np.load(out / "reference.npz") as f:
        x, clients = f["features"], f["clients"]
    models = {}
    for path in sorted(out.glob("model_*.npz")):
        with np.load(path) as f:
            models[path.stem.removeprefix("model_")] = f["features"]
    return x, clients, models


def run_stage(stage: str, out: Path) -> tuple[float, float]:
    """The work of one stage, in this process: its wall and CPU seconds (all threads;
    loading excluded, the CLI's start-up included)."""
    if stage == "cli":
        models = sorted(out.glob("model_*.npz"))
        cmd = [sys.executable, "-m", "distrank", "score", "--reference", str(out / "reference.npz")]
        for path in models:
            cmd += ["--model", f"{path.stem.removeprefix('model_')}={path}"]
        start, before = time.perf_counter(), os.times()
        subprocess.run([*cmd, "--out", str(out / "cli.csv")], check=True, stdout=subprocess.DEVNULL)
        after = os.times()
        cpu = sum(after[2:4]) - sum(before[2:4])  # children's user + system seconds
        return time.perf_counter() - start, cpu
    from distrank.metrics import score

    x, clients, models = load(out)
    metrics = {"api": ["kd", "fd", *PRDC], "kd": ["kd"], "fd": ["fd"], "prdc": PRDC}[stage]
    start, cpu = time.perf_counter(), time.process_time()
    table = score(x, clients, models, metrics=metrics)
    seconds = time.perf_counter() - start, time.process_time() - cpu
    table.to_csv(out / f"api_{stage}.csv", index=False)
    return seconds


def child(stage: str, out: Path, size) -> dict:
    """Run ``stage`` in a fresh process; its seconds and its own peak RSS."""
    cmd = [sys.executable, __file__, "--stage", stage, "--dir", str(out), "--size", fmt(size)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"stage {stage} failed (status {status})")
    # ru_maxrss of a child: the largest resident set of any process it waited for
    # too; the cli stage's figure is the larger of the driver and the CLI process.
    return {
        "stage": stage,
        "wall_s": round(time.perf_counter() - start, 2),
        "work_s": round(float(stdout.split()[-2]), 2),
        "cpu_s": round(float(stdout.split()[-1]), 2),
        "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 3),
    }


def compare(out: Path) -> float:
    """Largest relative difference between the CLI's table and the API's."""
    import pandas as pd

    keys = ["model", "metric", "aggregation", "client"]
    api = pd.read_csv(out / "api_api.csv")
    cli = pd.read_csv(out / "cli.csv")
    both = api.merge(cli, on=keys, suffixes=("_api", "_cli"), how="outer")
    if both[["value_api", "value_cli"]].isna().any().any():
        raise RuntimeError("CLI and API tables do not hold the same rows")
    diff = (both.value_api - both.value_cli).abs() / both.value_api.abs().clip(lower=1e-300)
    return float(diff.max())


def bench(size, stages, keep: Path | None) -> list[dict]:
    with tempfile.TemporaryDirectory(dir=keep) as tmp:
        out = Path(tmp)
        rows = []
        for stage in stages:
            row = {"size": fmt(size), **child(stage, out, size)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        if {"api", "cli"} <= set(stages):
            print(json.dumps({"size": fmt(size), "cli_vs_api_max_rel_diff": compare(out)}))
    return rows


def fmt(size) -> str:
    return ",".join(str(v) for v in size)


def parse_size(text: str) -> tuple[int, ...]:
    values = tuple(int(v) for v in text.split(","))
    if len(values) != 5 or min(values) < 1:
        raise argparse.ArgumentTypeError(f"size: expected n,K,M,m,d (positive ints), got {text!r}")
    return values


# ---- cost model: CPU time = work / rate + t0, peak RSS = r0 + bytes, per stage ----


def work(stage: str, size) -> np.ndarray:
    """The work terms of a stage ("kd", "fd" or "prdc"): its multiply-adds, and for
    FD also its per-client (d, d) terms.

    KD and PRDC form the blocks on and above the diagonal of the symmetric products.
    FD forms the clients' scatters once per chunk of models (``FD_CHUNK_BYTES``) and
    each model's once, and per (client, model) pair a rank-r product and its
    eigenvalues, r the smaller rank bound of the two sides (``frechet_distances``);
    its second term counts the (d, d) statistics it makes and pools per client and
    pass, memory-bound work that dominates when clients are small.
    """
    n, k, n_models, m, d = size
    sizes = client_sizes(n, k, np.random.default_rng(0)).astype(float)
    cross, models = n * n_models * m * d, n_models * m * m * d / 2
    if stage == "kd":  # S_XX, S_XY, S_YY
        return np.array([n * n * d / 2 + cross + models])
    if stage == "prdc":  # pooled and client k-NN radii, reference x model, model radii
        return np.array([(n * n + (sizes**2).sum()) * d / 2 + cross + models])
    from distrank.metrics.fd._family import FD_CHUNK_BYTES

    passes = -(-n_models // max(1, FD_CHUNK_BYTES // (8 * d * d)))
    r = np.minimum(np.append(sizes, n), min(m, d + 1)) - 1  # clients' pairs, FD_all's
    pairs = (r * d * d + r * r * d + r**3).sum()
    return np.array([(passes * n + n_models * m) * d * d + n_models * pairs, passes * k * d * d])


def nbytes(stage: str, size) -> float:
    """Bytes a stage must hold: float32 inputs, PRDC's client-grouped copy of the
    reference, FD's chunk of float64 (d, d) model covariances and two clients'."""
    from distrank.metrics.fd._family import FD_CHUNK_BYTES

    n, _, n_models, m, d = size
    held = {"kd": 0.0, "prdc": 4.0 * n * d, "fd": min(8.0 * n_models * d * d, FD_CHUNK_BYTES)}
    held["fd"] += 16.0 * d * d
    return 4.0 * (n + n_models * m) * d + held[stage]


def fit(rows: list[dict], stage: str) -> dict:
    """Non-negative least squares of CPU time on work (FD: both terms), and the
    largest measured excess of peak RSS over ``nbytes``, over the sizes (CPU seconds:
    other jobs on the machine stretch wall time, not CPU time)."""
    from scipy.optimize import nnls

    pts = [r for r in rows if r.get("stage") == stage]
    sizes = [parse_size(r["size"]) for r in pts]
    w = np.array([work(stage, s) for s in sizes]) / 1e9
    coef, _ = nnls(np.c_[w, np.ones(len(pts))], [r["cpu_s"] for r in pts])
    r0 = max(r["peak_rss_gib"] - nbytes(stage, s) / GIB for r, s in zip(pts, sizes))
    return {"s_per_gmac": coef[:-1], "t0_s": coef[-1], "r0_gib": r0}


def seconds(f: dict, stage: str, size) -> float:
    return float(work(stage, size) / 1e9 @ f["s_per_gmac"] + f["t0_s"])


def report(path: Path, target=(1_000_000, 1000, 10, 10_000, 2048)) -> None:
    """The fitted constants per stage, each measured point against the fit, and the
    projection to ``target`` on one machine (everything) and per client (the
    score_client job of the largest client)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    n, k, n_models, m, d = target
    largest = int(client_sizes(n, k, np.random.default_rng(0)).max())
    client = (largest, 1, n_models, m, d)
    fits = {}
    for stage in ("kd", "fd", "prdc"):
        f = fits[stage] = fit(rows, stage)
        rates = ", ".join(f"{a:.4f}" for a in f["s_per_gmac"])
        print(
            f"{stage:5s} CPU-s per G of work: {rates}; t0 {f['t0_s']:.1f} s; r0 {f['r0_gib']:.2f} GiB"
        )
        for r in (r for r in rows if r.get("stage") == stage):
            size = parse_size(r["size"])
            print(
                f"      {r['size']:28s} CPU {r['cpu_s']:8.1f} s  fit {seconds(f, stage, size):8.1f} s"
            )
        mem = [f["r0_gib"] + nbytes(stage, s) / GIB for s in (target, client)]
        print(
            f"      {fmt(target)}: {seconds(f, stage, target) / 3600:.1f} CPU-h, {mem[0]:.1f} GiB"
            f" | client of {largest} rows: {seconds(f, stage, client):.0f} CPU-s, {mem[1]:.2f} GiB"
        )
    # All six in one call: KD's sums come from PRDC's products, so KD adds only the
    # kernel's elementwise work, a share of KD alone measured on the api stage.
    for r in (r for r in rows if r.get("stage") == "api"):
        size = parse_size(r["size"])
        alone = {st: seconds(fits[st], st, size) for st in fits}
        share = (r["cpu_s"] - alone["fd"] - alone["prdc"]) / alone["kd"]
        total = sum(seconds(fits[st], st, target) * (share if st == "kd" else 1) for st in fits)
        print(
            f"api   {r['size']:28s} CPU {r['cpu_s']:8.1f} s; KD's share of KD alone {share:.2f}"
            f" | {fmt(target)}, all six: {total / 3600:.1f} CPU-h"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"one small size, {fmt(QUICK)}")
    p.add_argument("--sizes", nargs="+", type=parse_size, metavar="n,K,M,m,d")
    p.add_argument("--stages", nargs="+", choices=STAGES, default=["data", "api", "cli"])
    p.add_argument("--tmp", type=Path, help="folder for the feature files (default: system tmp)")
    p.add_argument("--fit", type=Path, metavar="JSONL", help="fit the cost model of these lines")
    p.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    p.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--size", type=parse_size, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.stage == "data":
        start, cpu = time.perf_counter(), time.process_time()
        write_data(args.size, args.dir)
        print(time.perf_counter() - start, time.process_time() - cpu)
    elif args.stage:
        print(*run_stage(args.stage, args.dir))
    elif args.fit:
        report(args.fit)
    else:
        for size in args.sizes or [QUICK if args.quick else FULL]:
            bench(size, args.stages, args.tmp)


if __name__ == "__main__":
    main()
