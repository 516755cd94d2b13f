"""Feature-extraction throughput: ``Extractor.extract`` (uint8 images in, preprocessing
included) against the bare network's forward pass on pre-made input tensors.

The ratio extract/bare is the share of time spent in the network; the goal is
>= 90 %. Throughputs are the best of ``--repeats`` runs; extract and bare runs
alternate, and the median of the per-pair ratios is printed too, being less
sensitive to background load on a shared machine.

    .venv/bin/python bench/bench_extract.py                  # Lite0, torch + onnx, 28x28 gray
    .venv/bin/python bench/bench_extract.py --resolution 128 224 --n 256

When CUDA is available it also prints Inception-v3 (FID network) images/s at
batch 256 on the GPU, for ``extract`` and the bare network (random weights
unless the real file is in the weights directory: speed does not depend on them).
"""

from __future__ import annotations

import argparse
import io
import json
import time
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


def bench_lite0(backend: str, resolution: int, images: np.ndarray, batch_size: int, repeats: int,
                threads: int, cache_dir: str | None) -> dict:
    ex = get_extractor("efficientnet_lite0", backend=backend, device="cpu", cache_dir=cache_dir,
                       resolution=resolution, num_threads=threads)
    batches = [images[i:i + batch_size] for i in range(0, len(images), batch_size)]
    inputs = [ex.preprocess(b) for b in batches]  # pre-made network inputs for the bare run
    if backend == "onnx":
        session, name = ex._session, ex._input_name
        arrays = [x.numpy() for x in inputs]

        def bare():
            for a in arrays:
                session.run(None, {name: a})
    else:
        inputs = [x.contiguous(memory_format=torch.channels_last) for x in inputs]

        def bare():
            with torch.inference_mode(), full_precision():
                for x in inputs:
                    ex.model(x)

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
    return {"extractor": "efficientnet_lite0", "backend": backend, "resolution": resolution,
            "n": n, "batch_size": batch_size, "threads": threads,
            "extract_img_s": n / min(t_extract), "bare_img_s": n / min(t_bare),
            "ratio": min(t_bare) / min(t_extract),
            "ratio_median_of_pairs": float(np.median(np.array(t_bare) / np.array(t_extract))),
            "preprocess_img_s": n / t_pre}


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
        with mock.patch.object(tfi.FeatureExtractorInceptionV3, "load_state_dict", lambda *a, **k: None):
            net = tfi.FeatureExtractorInceptionV3("random", ["2048"], feature_extractor_weights_path=empty)
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
    return {"extractor": "inception", "backend": "torch", "device": torch.cuda.get_device_name(),
            "weights": weights, "image_px": 256, "n": n, "batch_size": batch_size,
            "extract_img_s": n / t_extract, "bare_img_s": n / t_bare, "ratio": t_bare / t_extract}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=512, help="images per timing run (default 512)")
    parser.add_argument("--image-size", type=int, default=28, help="input side in px (default 28, Fashion-MNIST)")
    parser.add_argument("--channels", type=int, default=1, choices=(1, 3))
    parser.add_argument("--resolution", type=int, nargs="+", default=[128], help="Lite0 input px (default 128)")
    parser.add_argument("--backends", nargs="+", default=["torch", "onnx"], choices=("torch", "onnx"))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache-dir", default=None, help="weights directory (ONNX export cache)")
    parser.add_argument("--gpu-batch-size", type=int, default=256)
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.n, args.image_size, args.image_size, args.channels), dtype=np.uint8)
    results = []
    print(f"# {args.n} images {args.image_size}x{args.image_size}x{args.channels}, batch {args.batch_size}, "
          f"{args.threads} threads, best of {args.repeats}")
    print(f"{'extractor':<20}{'backend':<8}{'px':>5}{'extract img/s':>15}{'bare img/s':>12}{'ratio':>8}"
          f"{'median pair ratio':>19}{'preprocess img/s':>18}")
    for resolution in args.resolution:
        for backend in args.backends:
            r = bench_lite0(backend, resolution, images, args.batch_size, args.repeats, args.threads,
                            args.cache_dir)
            results.append(r)
            print(f"{r['extractor']:<20}{backend:<8}{resolution:>5}{r['extract_img_s']:>15.1f}"
                  f"{r['bare_img_s']:>12.1f}{r['ratio']:>8.1%}{r['ratio_median_of_pairs']:>19.1%}"
                  f"{r['preprocess_img_s']:>18.0f}", flush=True)
    if torch.cuda.is_available():
        r = bench_inception_gpu(args.gpu_batch_size, batches=8, repeats=args.repeats, cache_dir=args.cache_dir)
        results.append(r)
        print(f"inception (GPU {r['device']}, batch {r['batch_size']}, 256 px uint8 in, {r['weights']} weights): "
              f"extract {r['extract_img_s']:.0f} img/s, bare {r['bare_img_s']:.0f} img/s, ratio {r['ratio']:.1%}")
    else:
        print("inception GPU line skipped: CUDA is not available")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
