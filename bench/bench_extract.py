"""Feature-extraction throughput: ``Extractor.extract`` (uint8 images in, preprocessing
included) against the bare network's forward pass on pre-made input tensors.

The ratio extract/bare is the share of time spent in the network; the goal is
>= 90 %. Throughputs are the best of ``--repeats`` runs; extract and bare runs
alternate, and the median of the per-pair ratios is printed too, being less
sensitive to background load on a shared machine.

``--folder`` measures what ``distrank extract FOLDER`` does instead: real
Fashion-MNIST images written as PNG files are hashed, decoded (``--workers``
processes), batched and extracted through the feature cache
(``cached_input_features``, into a fresh cache folder each run), against the bare
network on the same images; it also prints the wall time of the whole command
(``distrank.cli.main``, the extractor's construction included). With decoding in
this process (``--workers 1``) the CPU-time ratio (this process's CPU seconds, all
threads) is the one to read on a loaded machine: other jobs stretch wall times,
not the work done.

    .venv/bin/python bench/bench_extract.py                  # Lite0, torch + onnx, 28x28 gray
    .venv/bin/python bench/bench_extract.py --resolution 128 224 --n 256
    .venv/bin/python bench/bench_extract.py --folder --backends onnx --n 1024

When CUDA is available it also prints Inception-v3 (FID network) images/s at
batch 256 on the GPU, for ``extract`` and the bare network (random weights
unless the real file is in the weights directory: speed does not depend on them).
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

from distrank.features import get_extractor
from distrank.features.base import full_precision


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def throughputs(n: int, t_extract: list[float], t_bare: list[float]) -> dict:
    """Images/s of both sides (best runs), their ratio, and the median of paired ratios."""
    return {
        "extract_img_s": n / min(t_extract),
        "bare_img_s": n / min(t_bare),
        "ratio": min(t_bare) / min(t_extract),
        "ratio_median_of_pairs": float(np.median(np.array(t_bare) / np.array(t_extract))),
    }


def bench_lite0(
    backend: str,
    resolution: int,
    images: np.ndarray,
    batch_size: int,
    repeats: int,
    threads: int,
    cache_dir: str | None,
) -> dict:
    ex = get_extractor(
        "efficientnet_lite0",
        backend=backend,
        device="cpu",
        cache_dir=cache_dir,
        resolution=resolution,
        num_threads=threads,
    )
    batches = [images[i : i + batch_size] for i in range(0, len(images), batch_size)]
    bare = bare_forward(ex, batches)

    def extract():
        ex.extract(images, batch_size=batch_size)

    def preprocess_only():
        for b in batches:
            ex.preprocess(b)

    extract(), bare()  # warm-up (allocations, oneDNN primitives, ORT arenas)
    t_extract, t_bare = [], []
    for _ in range(repeats):  # adjacent pairs see similar background load
        t_extract.append(best_of(extract, 1))
        t_bare.append(best_of(bare, 1))
    t_pre = best_of(preprocess_only, repeats)
    n = len(images)
    return {
        "extractor": "efficientnet_lite0",
        "backend": backend,
        "resolution": resolution,
        "n": n,
        "batch_size": batch_size,
        "threads": threads,
        **throughputs(n, t_extract, t_bare),
        "preprocess_img_s": n / t_pre,
    }


def bare_forward(ex, batches: list[np.ndarray]):
    """The network alone on pre-made inputs of ``batches`` (no preprocessing, no I/O)."""
    inputs = [ex.preprocess(b) for b in batches]
    if ex.backend == "onnx":
        network = ex._session  # the OnnxNetwork: the onnxruntime session and nothing else
        arrays = [x.numpy() for x in inputs]
        return lambda: [network(a) for a in arrays]
    inputs = [x.contiguous(memory_format=torch.channels_last) for x in inputs]

    def bare():
        with torch.inference_mode(), full_precision():
            for x in inputs:
                ex.model(x)

    return bare


def bench_folder(
    backend: str,
    resolution: int,
    n: int,
    batch_size: int,
    repeats: int,
    threads: int,
    workers: int,
    cache_dir: str | None,
) -> dict:
    """``distrank extract`` on a folder of n Fashion-MNIST PNGs against the bare network."""
    from PIL import Image

    from distrank.cli import main
    from distrank.data.fashion_mnist import load_fashion_mnist
    from distrank.data.folders import open_images
    from distrank.features.cache import cached_input_features

    images = load_fashion_mnist("test")[0][:n]
    with tempfile.TemporaryDirectory(prefix="bench-extract-") as tmp:
        folder = Path(tmp) / "images"
        folder.mkdir()
        for i, image in enumerate(images):
            Image.fromarray(image).save(folder / f"{i:05d}.png")
        ex = get_extractor(
            "efficientnet_lite0",
            backend=backend,
            device="cpu",
            cache_dir=cache_dir,
            resolution=resolution,
            num_threads=threads,
        )
        gray = images[..., None]  # grayscale PNGs decode to one channel
        bare = bare_forward(ex, [gray[i : i + batch_size] for i in range(0, n, batch_size)])
        runs = iter(range(10**6))

        def extract():
            cached_input_features(
                open_images(folder)[0],
                ex,
                batch_size=batch_size,
                workers=workers,
                cache_dir=Path(tmp) / f"cache{next(runs)}",
            )

        extract(), bare()  # warm-up
        t_extract, t_bare, cpu_extract, cpu_bare = [], [], [], []
        for _ in range(repeats):
            for fn, wall, cpu in ((extract, t_extract, cpu_extract), (bare, t_bare, cpu_bare)):
                start = time.process_time()  # this process, all threads
                wall.append(best_of(fn, 1))
                cpu.append(time.process_time() - start)
        command = [
            "extract",
            str(folder),
            "--out",
            str(Path(tmp) / "f.npz"),
            "--no-cache",
            "--quiet",
            "--backend",
            backend,
            "--device",
            "cpu",
            "--batch-size",
            str(batch_size),
            "--workers",
            str(workers),
        ]
        command += ["--weights-dir", cache_dir] if cache_dir else []
        start = time.perf_counter()
        main(command)
        t_command = time.perf_counter() - start
    return {
        "extractor": "efficientnet_lite0",
        "backend": backend,
        "resolution": resolution,
        "input": "folder of 28x28 PNG",
        "n": n,
        "batch_size": batch_size,
        "threads": threads,
        "workers": workers,
        **throughputs(n, t_extract, t_bare),
        "cpu_ratio": min(cpu_bare) / min(cpu_extract),
        "command_s": t_command,
        "command_img_s": n / t_command,
    }


def bench_inception_gpu(batch_size: int, batches: int, repeats: int, cache_dir: str | None) -> dict:
    from distrank.features.inception import InceptionExtractor
    from distrank.features.weights import WEIGHTS, weights_dir

    spec = WEIGHTS["inception"]
    local = [weights_dir(cache_dir) / n for n in (spec.filename, *spec.aliases)]
    local = [p for p in local if p.is_file()]
    if local:
        ex = InceptionExtractor(device="cuda", weights_path=local[0])
        weights = "real"
    else:
        import torch_fidelity.feature_extractor_inceptionv3 as tfi

        empty = io.BytesIO()
        torch.save({}, empty)
        empty.seek(0)
        with mock.patch.object(
            tfi.FeatureExtractorInceptionV3, "load_state_dict", lambda *a, **k: None
        ):
            net = tfi.FeatureExtractorInceptionV3(
                "random", ["2048"], feature_extractor_weights_path=empty
            )
        path = weights_dir(cache_dir) / "bench-random-inception.pth"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(net.state_dict(), path)
        ex = InceptionExtractor(device="cuda", weights_path=path)
        weights = "random"
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch_size * batches, 256, 256, 3), dtype=np.uint8)
    x = torch.from_numpy(images[:batch_size]).cuda().permute(0, 3, 1, 2).contiguous()

    def bare():
        with torch.inference_mode(), full_precision():
            for _ in range(batches):
                ex.model(x)
        torch.cuda.synchronize()

    def extract():
        ex.extract(images, batch_size=batch_size)
        torch.cuda.synchronize()

    extract(), bare()
    n = batch_size * batches
    t_extract, t_bare = best_of(extract, repeats), best_of(bare, repeats)
    return {
        "extractor": "inception",
        "backend": "torch",
        "device": torch.cuda.get_device_name(),
        "weights": weights,
        "image_px": 256,
        "n": n,
        "batch_size": batch_size,
        "extract_img_s": n / t_extract,
        "bare_img_s": n / t_bare,
        "ratio": t_bare / t_extract,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=512, help="images per timing run (default 512)")
    parser.add_argument(
        "--image-size", type=int, default=28, help="input side in px (default 28, Fashion-MNIST)"
    )
    parser.add_argument("--channels", type=int, default=1, choices=(1, 3))
    parser.add_argument(
        "--resolution", type=int, nargs="+", default=[128], help="Lite0 input px (default 128)"
    )
    parser.add_argument(
        "--backends", nargs="+", default=["torch", "onnx"], choices=("torch", "onnx")
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache-dir", default=None, help="weights directory (ONNX export cache)")
    parser.add_argument("--gpu-batch-size", type=int, default=256)
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument(
        "--folder",
        action="store_true",
        help="time `distrank extract` on a folder of PNGs (see above)",
    )
    parser.add_argument("--workers", type=int, default=1, help="--folder: decoding processes")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    if args.folder:
        return main_folder(args)
    rng = np.random.default_rng(0)
    images = rng.integers(
        0, 256, (args.n, args.image_size, args.image_size, args.channels), dtype=np.uint8
    )
    results = []
    print(
        f"# {args.n} images {args.image_size}x{args.image_size}x{args.channels}, "
        f"batch {args.batch_size}, {args.threads} threads, best of {args.repeats}"
    )
    print(
        f"{'extractor':<20}{'backend':<8}{'px':>5}{'extract img/s':>15}{'bare img/s':>12}"
        f"{'ratio':>8}{'median pair ratio':>19}{'preprocess img/s':>18}"
    )
    for resolution in args.resolution:
        for backend in args.backends:
            r = bench_lite0(
                backend,
                resolution,
                images,
                args.batch_size,
                args.repeats,
                args.threads,
                args.cache_dir,
            )
            results.append(r)
            print(
                f"{r['extractor']:<20}{backend:<8}{resolution:>5}{r['extract_img_s']:>15.1f}"
                f"{r['bare_img_s']:>12.1f}{r['ratio']:>8.1%}{r['ratio_median_of_pairs']:>19.1%}"
                f"{r['preprocess_img_s']:>18.0f}",
                flush=True,
            )
    if torch.cuda.is_available():
        r = bench_inception_gpu(
            args.gpu_batch_size, batches=8, repeats=args.repeats, cache_dir=args.cache_dir
        )
        results.append(r)
        print(
            f"inception (GPU {r['device']}, batch {r['batch_size']}, 256 px uint8 in, "
            f"{r['weights']} weights): extract {r['extract_img_s']:.0f} img/s, "
            f"bare {r['bare_img_s']:.0f} img/s, ratio {r['ratio']:.1%}"
        )
    else:
        print("inception GPU line skipped: CUDA is not available")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return 0


def main_folder(args) -> int:
    from distrank._progress import set_quiet

    set_quiet(True)
    print(
        f"# distrank extract on {args.n} Fashion-MNIST PNGs (28x28), batch {args.batch_size}, "
        f"{args.threads} threads, {args.workers} decoding workers, best of {args.repeats}"
    )
    print(
        f"{'backend':<8}{'px':>5}{'extract img/s':>15}{'bare img/s':>12}{'ratio':>8}"
        f"{'median pair ratio':>19}{'CPU-time ratio':>16}{'command s':>11}"
        f"{'command img/s':>15}"
    )
    results = []
    for resolution in args.resolution:
        for backend in args.backends:
            r = bench_folder(
                backend,
                resolution,
                args.n,
                args.batch_size,
                args.repeats,
                args.threads,
                args.workers,
                args.cache_dir,
            )
            results.append(r)
            print(
                f"{backend:<8}{resolution:>5}{r['extract_img_s']:>15.1f}{r['bare_img_s']:>12.1f}"
                f"{r['ratio']:>8.1%}{r['ratio_median_of_pairs']:>19.1%}{r['cpu_ratio']:>16.1%}"
                f"{r['command_s']:>11.2f}{r['command_img_s']:>15.1f}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
