"""A whole ``distrank score`` process on feature files vs a plain numpy/scipy script.

    .venv/bin/python bench/bench_cli.py                 # n=6000 x d=512 in 6 clients, 4 models
    .venv/bin/python bench/bench_cli.py --repeats 5

Both sides are subprocesses timed from launch to exit (interpreter start-up, imports,
reading the npz files, scoring and writing the table), alternately, ``--repeats``
times; the ratios are of the medians, of wall time and of CPU time (user + system;
the steadier of the two on a shared machine). Both compute KD (poly, unbiased) and FD, pooled
and per client, for every model. The plain script (``--plain``, run by this file in
its own process) is the per-client loop one writes with numpy and scipy: for each
model and each part (the pool and every client), the three kernel matrices with
KID's polynomial kernel and the unbiased formula, and FID's ``scipy.linalg.sqrtm``
formula on ``np.cov`` statistics. Values of the two are compared at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def plain(reference: Path, models: list[Path], out: Path) -> None:
    """The per-client numpy/scipy loop (imports only numpy and scipy.linalg)."""
    import scipy.linalg

    ref = np.load(reference)
    x, clients = ref["features"], ref["clients"]
    parts = {"": x} | {str(c): x[clients == c] for c in np.unique(clients)}
    rows = []
    for path in models:
        y = np.load(path)["features"]
        my, cy = y.mean(axis=0), np.cov(y, rowvar=False)
        for key, part in parts.items():
            n, m, d = len(part), len(y), x.shape[1]
            kxx = (part @ part.T / d + 1) ** 3
            kyy = (y @ y.T / d + 1) ** 3
            kxy = (part @ y.T / d + 1) ** 3
            kd = (
                (kxx.sum() - np.trace(kxx)) / (n * (n - 1))
                + (kyy.sum() - np.trace(kyy)) / (m * (m - 1))
                - 2 * kxy.sum() / (n * m)
            )
            mx, cx = part.mean(axis=0), np.cov(part, rowvar=False)
            root = scipy.linalg.sqrtm(cx @ cy).real
            fd = np.sum((mx - my) ** 2) + np.trace(cx) + np.trace(cy) - 2 * np.trace(root)
            rows += [f"{path.stem},kd,{key},{float(kd)!r}", f"{path.stem},fd,{key},{float(fd)!r}"]
    out.write_text("model,metric,client,value\n" + "\n".join(rows) + "\n")


def make_files(folder: Path, args) -> tuple[Path, list[Path]]:
    rng = np.random.default_rng(args.seed)
    centers = rng.normal(scale=0.3, size=(args.clients, args.d))
    clients = rng.integers(0, args.clients, size=args.n)
    x = rng.standard_normal((args.n, args.d)) + centers[clients]
    np.savez(folder / "reference.npz", features=x.astype(np.float32), clients=clients)
    models = []
    for g in range(args.models):
        y = rng.uniform(0.8, 1.2) * rng.standard_normal((args.m, args.d))
        models.append(folder / f"model{g}.npz")
        np.savez(models[-1], features=y.astype(np.float32))
    return folder / "reference.npz", models


def timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the process and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def compare(ours: Path, theirs: Path) -> dict[str, float]:
    import pandas as pd

    a = pd.read_csv(ours, keep_default_na=False, dtype={"client": str})
    a = a[a.aggregation != "avg"].assign(model=a.model.astype(str))
    a = pd.to_numeric(a.set_index(["model", "metric", "client"]).value, errors="coerce")
    b = pd.read_csv(theirs, keep_default_na=False, dtype={"client": str})
    b = pd.to_numeric(b.set_index(["model", "metric", "client"]).value, errors="coerce")
    rel = ((a.reindex(b.index) - b).abs() / b.abs()).groupby(level="metric").max()
    return rel.to_dict()


def _arguments(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=6000, help="reference rows")
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--m", type=int, default=2000, help="rows per model")
    p.add_argument("--models", type=int, default=4)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plain", nargs="+", type=Path, metavar="PATH", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = _arguments(argv)
    if args.plain:  # the plain side, in its own process: OUT REFERENCE MODEL...
        plain(args.plain[1], args.plain[2:], args.plain[0])
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        reference, models = make_files(folder, args)
        ours_csv, plain_csv = folder / "ours.csv", folder / "plain.csv"
        cli = [sys.executable, "-m", "distrank", "score", "-q", "--reference", str(reference)]
        cli += [f"--model={p.stem}={p}" for p in models]
        cli += ["--metric", "kd", "fd", "--out", str(ours_csv)]
        script = [sys.executable, __file__, "--plain", str(plain_csv), str(reference)]
        script += [str(p) for p in models]
        print(
            f"n={args.n} in {args.clients} clients, {args.models} models x m={args.m}, "
            f"d={args.d}; load average {os.getloadavg()[0]:.1f}; "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
            flush=True,
        )
        t_cli, t_plain = [], []
        for r in range(args.repeats):
            t_cli.append(timed(cli))
            t_plain.append(timed(script))
            print(
                f"  run {r}: distrank score {t_cli[-1][0]:.2f} s ({t_cli[-1][1]:.2f} s CPU), "
                f"plain {t_plain[-1][0]:.2f} s ({t_plain[-1][1]:.2f} s CPU)",
                flush=True,
            )
        for i, kind in enumerate(("wall", "CPU")):
            a = statistics.median(t[i] for t in t_cli)
            b = statistics.median(t[i] for t in t_plain)
            print(f"median {kind}: distrank score {a:.2f} s, plain loop {b:.2f} s: {b / a:.2f}x")
        for metric, rel in compare(ours_csv, plain_csv).items():
            print(f"  {metric}: max relative difference {rel:.2e}")


if __name__ == "__main__":
    main()
