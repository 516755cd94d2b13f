"""Kernel mean sketches against exact KD_all, and TensorSketch's error on KID's kernel.

    .venv/bin/python bench/bench_sketch.py [--quick]         # sketch vs exact, side by side
    .venv/bin/python bench/bench_sketch.py --tensorsketch [--quick] [--features DIR]
    .venv/bin/python bench/bench_sketch.py --memory [--images 200] [--dim 4096]

Default stage: the same rows (a reference and ``--models`` models of rectified Gaussian
2048-d features, like Inception's pool3) scored two ways, each in its own subprocess
(wall time, peak RSS from ``resource.getrusage``): ``distrank.metrics.sketch._maps`` (random
Fourier features, D = 8192, float64; sketch every set, then one dot product per model)
against ``distrank.metrics.kd._sums.kernel_sums`` with the rbf kernel (float32 products,
float64 sums, the package's default) for KD_all of every model; the bandwidth is the
median heuristic on the reference. Prints the ratio and the sketch's error.

``--tensorsketch``: ``distrank.metrics.sketch._tensorsketch`` at D = 2^10 .. 2^16 against exact
KID (``kernel_sums``, poly kernel, U-statistic) on synthetic features and, where
``--features`` holds a pipeline's ``reference.npz`` and ``model_*.npz``, on those:
relative KD error (median and max over the models) and Kendall's tau of the ranking.

``--memory``: what one site's ``distrank sketch`` costs, a whole process: ``--images``
random 28 x 28 grayscale PNGs sketched at ``--dim`` (EfficientNet-Lite0 features, onnx),
from an empty folder with its own HOME (a fresh user cache), twice: the first run exports
the network to ONNX (in a child process that imports torch), the second finds the export;
the peak RSS of each run, the largest of its processes (``getrusage(RUSAGE_CHILDREN)``
after each run alone), and its wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

FEATURES = Path(__file__).resolve().parents[1] / "results/default/features"


def synthetic(n: int, d: int, model: int, seed: int = 0) -> np.ndarray:
    """n rectified Gaussian rows (float32): relu(mu + A u + e), u of 32 latent factors.

    ``model`` 0 is the reference's distribution; model g >= 1 moves the mean along a
    fixed direction by 0.015 g and widens the factors by 3 g percent, so KD grows with
    g and neighbours are close. Each (model, seed) has its own rows.
    """
    fixed = np.random.default_rng([1234, d])
    mu = fixed.normal(-0.1, 0.4, d)
    a = fixed.normal(0, 0.5 / np.sqrt(32), (d, 32))
    v = fixed.normal(0, 1, d)
    rng = np.random.default_rng([seed, model, n])
    out = np.empty((n, d), np.float32)
    for start in range(0, n, 8192):
        b = min(n, start + 8192) - start
        z = (1 + 0.03 * model) * rng.standard_normal((b, 32)) @ a.T
        z += mu + 0.015 * model * v + rng.normal(0, 0.5, (b, d))
        out[start : start + b] = np.maximum(z, 0)
    return out


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_side(args) -> None:
    """One side in this process: JSON with its seconds, peak RSS and KD_all per model."""
    import torch

    from distrank.metrics import make_kernel, median_bandwidth
    from distrank.metrics.kd import kernel_sums
    from distrank.metrics.sketch._maps import FeatureMap, sketch_kd

    ref = synthetic(args.n, args.d, 0)
    models = [synthetic(args.m, args.d, g + 1) for g in range(args.models)]
    h = median_bandwidth(ref)
    base = rss_mib()
    start = time.perf_counter()
    if args.side == "sketch":
        fmap = FeatureMap(args.d, args.dim, h, seed=0)
        s = fmap.sketch(ref)
        kd = [sketch_kd(s, fmap.sketch(y)) for y in models]
    else:
        kernel = make_kernel("rbf", {"bandwidth": h}, args.d)
        index = np.zeros(args.n, np.int64)
        sums = kernel_sums(torch.from_numpy(ref), index, map(torch.from_numpy, models), kernel)
        kd = sums.kd()[1].tolist()
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "peak": rss_mib(), "base": base, "kd": kd}))


def compare(args) -> None:
    from scipy.stats import kendalltau

    rows = args.n + args.models * args.m
    print(
        f"load average {os.getloadavg()[0]:.1f}; {rows} rows of {args.d}-d: reference "
        f"{args.n}, {args.models} models x {args.m}; RFF D = {args.dim}"
    )
    result = {}
    for side in ("sketch", "exact"):
        cmd = [sys.executable, __file__, "--side", side, "--n", str(args.n), "--m", str(args.m)]
        cmd += ["--models", str(args.models), "--d", str(args.d), "--dim", str(args.dim)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        result[side] = json.loads(out.splitlines()[-1])
        r = result[side]
        print(
            f"  {side:6s} {r['seconds']:8.1f} s   peak RSS {r['peak']:7.0f} MiB "
            f"({r['peak'] - r['base']:+.0f} MiB over the data)"
        )
    s, e = (np.array(result[k]["kd"]) for k in ("sketch", "exact"))
    print(
        f"  ratio exact / sketch: {result['exact']['seconds'] / result['sketch']['seconds']:.1f}x"
    )
    rel = np.abs(s - e) / np.abs(e)
    print(
        f"  sketch KD error: median {np.median(rel):.2%}, max {rel.max():.2%}; "
        f"Kendall tau {kendalltau(s, e)[0]:.3f}; KD_all {e.min():.3g} .. {e.max():.3g}"
    )


def exact_kid(ref: np.ndarray, models: list[np.ndarray]) -> np.ndarray:
    import torch

    from distrank.metrics import make_kernel
    from distrank.metrics.kd import kernel_sums

    kernel = make_kernel("poly", None, ref.shape[1])
    index = np.zeros(len(ref), np.int64)
    return kernel_sums(torch.from_numpy(ref), index, map(torch.from_numpy, models), kernel).kd()[1]


def error_table(name: str, ref, models, dims, seeds) -> None:
    from scipy.stats import kendalltau

    from distrank.metrics.sketch._tensorsketch import TensorSketchMap, tensorsketch_kd

    start = time.perf_counter()
    exact = exact_kid(ref, models)
    print(
        f"\n{name}: reference {len(ref)} x {ref.shape[1]}, {len(models)} models x "
        f"{len(models[0])}; exact KID (U) {exact.min():.3g} .. {exact.max():.3g} "
        f"({time.perf_counter() - start:.0f} s)"
    )
    print("| D | KD rel. error, median | max | max abs. error | Kendall tau | sketch s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for dim in dims:
        rel, err, taus, start = [], [], [], time.perf_counter()
        for seed in range(seeds):
            fmap = TensorSketchMap(ref.shape[1], dim, seed=seed)
            s = fmap.sketch(ref)
            kd = np.array([tensorsketch_kd(s, fmap.sketch(y)) for y in models])
            err.append(np.abs(kd - exact))
            rel.append(err[-1] / np.abs(exact))
            taus.append(kendalltau(kd, exact)[0])
        rel = np.array(rel)
        seconds = (time.perf_counter() - start) / seeds
        print(
            f"| 2^{int(np.log2(dim))} | {np.median(rel):.2%} | {rel.max():.2%} | {np.max(err):.2g} | "
            f"{np.mean(taus):.3f} | {seconds:.0f} |"
        )
    norms(ref, dims)


def norms(ref, dims) -> None:
    """|psi(x)| / |x'|^3 over reference rows (its mean square is 1), and the
    deterministic bound for rows clipped to the largest reference norm."""
    from distrank.metrics.sketch._tensorsketch import TensorSketchMap

    x = ref[:1000]
    for dim in (dims[0], dims[-1]):
        fmap = TensorSketchMap(x.shape[1], dim, clip_norm=float(np.linalg.norm(ref, axis=1).max()))
        ratio = (
            np.linalg.norm(fmap.features(x), axis=1) / np.linalg.norm(fmap.augment(x), axis=1) ** 3
        )
        radius = np.sqrt(fmap.gamma * fmap.clip_norm**2 + fmap.coef0)
        print(
            f"  D = {dim}: |psi(x)| / |x'|^3 over 1000 rows: {ratio.min():.3f} .. {ratio.max():.3f}; "
            f"deterministic bound / R^3 = {fmap.norm_bound() / radius**3:.0f}"
        )


def tensorsketch(args) -> None:
    dims = [2**k for k in ((10, 12, 14) if args.quick else range(10, 17))]
    print(f"load average {os.getloadavg()[0]:.1f}; seeds {args.seeds}")
    ref = synthetic(args.ts_n, args.d, 0)
    models = [synthetic(args.ts_m, args.d, g + 1) for g in range(args.models)]
    error_table("synthetic rectified Gaussians", ref, models, dims, args.seeds)
    features = Path(args.features)
    if (features / "reference.npz").exists():
        ref = np.load(features / "reference.npz")["features"]
        paths = sorted(features.glob("model_*.npz"))
        models = [np.load(p)["features"] for p in paths]
        print("models:", ", ".join(p.stem.removeprefix("model_") for p in paths))
        error_table(f"features in {features}", ref, models, dims, args.seeds)


def memory(args) -> None:
    """``--memory``: two ``distrank sketch`` processes on the same PNGs (module doc)."""
    import tempfile

    from PIL import Image

    distrank = Path(sys.executable).with_name("distrank")
    with tempfile.TemporaryDirectory(prefix="bench-sketch-memory-") as tmp:
        root = Path(tmp)
        images, here, home = root / "images", root / "here", root / "home"
        for folder in (images, here, home):
            folder.mkdir()
        rng = np.random.default_rng(0)
        for i in range(args.images):
            pixels = (rng.random((28, 28)) ** 2 * 255).astype(np.uint8)
            Image.fromarray(pixels, "L").save(images / f"{i:05d}.png")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTRANK_")}
        env |= {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "DISTRANK_QUIET": "1"}
        command = [str(distrank), "sketch", "--reference", str(images), "--dim", str(args.dim)]
        command += ["--seed", "1", "--bandwidth", "12.5", "--no-cache"]
        print(f"distrank sketch of {args.images} PNGs, D = {args.dim}, from an empty folder:")
        for run in ("first (exports)", "second"):
            # each run in a child of its own: RUSAGE_CHILDREN's maximum is then that run's
            code = (
                "import resource, subprocess, sys, time; t = time.perf_counter(); "
                "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, "
                "stderr=subprocess.DEVNULL); print(time.perf_counter() - t, "
                "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
            )
            out = command + ["--out", str(here / f"{run.split()[0]}.sketch.npz")]
            line = subprocess.run(
                [sys.executable, "-c", code, *out],
                cwd=here,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()
            print(f"  {run:16s} peak RSS {int(line[1]) / 1024:6.0f} MB, {float(line[0]):5.1f} s")
        left = sorted(p.name for p in here.iterdir())
        print(f"  files in the current folder: {left} (the two --out files only)")


def _arguments(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (~1 min)")
    p.add_argument("--tensorsketch", action="store_true", help="TensorSketch's error table")
    p.add_argument("--n", type=int, help="reference rows (default 20000; --quick 2000)")
    p.add_argument("--m", type=int, help="rows per model (default 8000; --quick 800)")
    p.add_argument("--models", type=int, default=10)
    p.add_argument("--d", type=int, default=2048)
    p.add_argument("--dim", type=int, default=8192, help="RFF features")
    p.add_argument("--ts-n", type=int, help="TensorSketch reference rows (10000; --quick 2000)")
    p.add_argument("--ts-m", type=int, help="TensorSketch rows per model (2000; --quick 500)")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--features", default=str(FEATURES), help="a pipeline's features folder")
    p.add_argument("--side", choices=("sketch", "exact"), help=argparse.SUPPRESS)
    p.add_argument("--memory", action="store_true", help="a site's distrank sketch, peak RSS")
    p.add_argument("--images", type=int, default=200, help="--memory: PNGs (default 200)")
    args = p.parse_args(argv)
    if args.memory and "--dim" not in (argv or sys.argv[1:]):
        args.dim = 4096
    small = args.quick
    args.n = args.n or (2000 if small else 20000)
    args.m = args.m or (800 if small else 8000)
    args.ts_n = args.ts_n or (2000 if small else 10000)
    args.ts_m = args.ts_m or (500 if small else 2000)
    return args


def main(argv=None) -> None:
    args = _arguments(argv)
    if args.side:
        run_side(args)
    elif args.memory:
        memory(args)
    elif args.tensorsketch:
        tensorsketch(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
