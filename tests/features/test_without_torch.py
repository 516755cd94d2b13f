"""Once EfficientNet-Lite0 is exported, its onnx backend extracts without importing torch
(about 700 MB of a process's memory): the export is found by name (torch's version read
from its version.py), the network is never built, and the resize matrices are read back
from beside the export, the same float32 numbers torch makes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from distrank.features.onnx_backend import torch_version  # noqa: E402
from distrank.features.preprocess import resize_matrix, stored_resize_matrix  # noqa: E402


def test_torch_version_is_torchs_own():
    assert torch_version() == torch.__version__  # with its local tag (+cu130, +cpu)


@pytest.mark.parametrize("n_in, n_out, aa", [(28, 128, True), (40, 32, True), (28, 299, False)])
def test_stored_resize_matrix_is_torchs_bit_for_bit(tmp_path, n_in, n_out, aa):
    made = stored_resize_matrix(tmp_path, n_in, n_out, "bilinear", aa)
    (path,) = tmp_path.iterdir()
    assert path.name.startswith(f"resize-bilinear{'-aa' if aa else ''}-{n_in}to{n_out}-torch")
    kept = np.load(path)
    want = resize_matrix(n_in, n_out, "bilinear", aa)
    assert kept.dtype == np.float32 and kept.shape == (n_out, n_in)
    np.testing.assert_array_equal(kept, want)
    np.testing.assert_array_equal(made, want)
    stored_resize_matrix.cache_clear()
    np.save(path, np.zeros((2, 2), np.float32))  # a wrong file is made again
    np.testing.assert_array_equal(stored_resize_matrix(tmp_path, n_in, n_out, "bilinear", aa), want)
    np.testing.assert_array_equal(np.load(path), want)


SCRIPT = """
import json, sys
import numpy as np
from distrank.features import get_extractor
from distrank.features.inputs import InputFeatures
from distrank.metrics.sketch._maps import release_sketch
from distrank.metrics.sketch._maps import FeatureMap
images = np.load(sys.argv[1])
ex = InputFeatures("efficientnet_lite0", weights_dir=sys.argv[2]).extractor
features = ex.extract(images, batch_size=4)
np.save(sys.argv[3], features)
print(json.dumps({"torch": "torch" in sys.modules, "backend": ex.backend,
                  "meta": ex.metadata()}))
"""


def test_the_onnx_backend_extracts_without_torch(tmp_path, lite0_onnx, gray_images):
    """A fresh process on a folder holding the export and the 28 px resize matrix never
    imports torch, picks the onnx backend on this machine (``auto``, no GPU device) and
    gives the features and metadata of the session's extractor."""
    if os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd"):
        pytest.skip("auto picks torch on a machine with a GPU")
    folder = tmp_path / "weights"
    (folder / "onnx").mkdir(parents=True)
    shutil.copyfile(lite0_onnx.onnx_path, folder / "onnx" / lite0_onnx.onnx_path.name)
    stored_resize_matrix(folder / "onnx", 28, 128, "bilinear", True)
    np.save(tmp_path / "images.npy", gray_images)
    out = tmp_path / "features.npy"
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "images.npy"), str(folder), str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["torch"] is False and got["backend"] == "onnx"
    assert got["meta"] == json.loads(json.dumps(lite0_onnx.metadata()))
    np.testing.assert_array_equal(np.load(out), lite0_onnx.extract(gray_images, batch_size=4))


def test_the_first_run_exports_in_a_child_without_torch(tmp_path, lite0_onnx, gray_images):
    """A fresh process on an empty weights folder exports the network and makes the 28 px
    resize matrix in child processes (distrank.features.torch_child): it never imports
    torch itself, and the export, the matrix and the features are the bytes that a process
    with torch makes in-process (the session's extractor)."""
    if os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd"):
        pytest.skip("auto picks torch on a machine with a GPU")
    folder = tmp_path / "weights"
    np.save(tmp_path / "images.npy", gray_images)
    out = tmp_path / "features.npy"
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "images.npy"), str(folder), str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(run.stdout.splitlines()[-1])
    assert got["torch"] is False and got["backend"] == "onnx"
    exported = folder / "onnx" / lite0_onnx.onnx_path.name
    assert exported.read_bytes() == lite0_onnx.onnx_path.read_bytes()
    (matrix,) = (folder / "onnx").glob("resize-*.npy")
    np.testing.assert_array_equal(np.load(matrix), resize_matrix(28, 128, "bilinear", True))
    assert sorted(p.name for p in (folder / "onnx").iterdir()) == sorted(
        [exported.name, matrix.name]
    )
    np.testing.assert_array_equal(np.load(out), lite0_onnx.extract(gray_images, batch_size=4))


def test_a_failing_torch_child_says_why():
    from distrank.features.torch_child import run

    with pytest.raises(
        RuntimeError,
        match=r"(?s)torch child process \(distrank:nonsense\) exited 1:.*AttributeError",
    ):
        run("distrank:nonsense")


GPU_PAGES = """
import json
import torch
from distrank.features.torch_child import _GPU_LIBRARY, release_gpu_libraries

def resident():
    kb, name = {"gpu": 0, "other": 0}, ""
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else ""
        elif head[0] == "Rss:":
            kb["gpu" if _GPU_LIBRARY.search(name) else "other"] += int(head[1])
    return kb

before = resident()
advised = release_gpu_libraries()
print(json.dumps({"before": before, "after": resident(), "advised": advised}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_PAGEOUT is Linux's")
def test_the_torch_child_drops_the_cuda_libraries_clean_pages():
    """A process that imported a CUDA build of torch holds ~160 MB of the CUDA libraries'
    pages (cuBLASLt's most); :func:`release_gpu_libraries` drops those that equal their
    files (all but the ~20 MB of relocated data) and nothing else: the pages of every
    other mapping stay."""
    got = json.loads(
        subprocess.run(
            [sys.executable, "-c", GPU_PAGES], capture_output=True, text=True, check=True
        ).stdout
    )
    before, after = got["before"], got["after"]
    if before["gpu"] < 10_000:
        pytest.skip("this torch maps no CUDA libraries (a CPU build)")
    assert got["advised"] > 0
    assert after["gpu"] < before["gpu"] / 5, got
    assert after["other"] >= 0.9 * before["other"], got
