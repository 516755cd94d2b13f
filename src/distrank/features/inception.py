"""The FID Inception-v3: pool3 (2048-d) features comparable with published FID.

The network is torch-fidelity's ``FeatureExtractorInceptionV3``: the PyTorch
port of the 2015-12-05 TensorFlow graph that FID is defined on, with its
TF-specific layers (FID's max-pool branch in the last block, average pools
that exclude padding) and TensorFlow 1.x's bilinear resize
(``interpolate_bilinear_2d_like_tensorflow1x``, no half-pixel offset, no
antialiasing) to 299 x 299, then ``(x - 128) / 128``. Both happen inside the
network, on the uint8 images; this module only moves them to NCHW and repeats
grayscale to RGB.

Weights: ``pt_inception-2015-12-05-6726825d.pth`` (the same file as
torch-fidelity's ``weights-inception-2015-12-05-6726825d.pth``), found in the
weights directory or downloaded (see :mod:`distrank.features.weights`), and
unpickled with ``torch.load(weights_only=True)``. torch-fidelity itself would
unpickle the file with ``weights_only=False``; it is handed an in-memory
re-serialisation of the tensors already loaded safely, never the file.

Feature dimension 2048; FD on these features is FID.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from .base import Extractor, full_precision, package_versions, resolve_device
from .preprocess import check_images
from .weights import WEIGHTS, file_sha256, load_state_dict, resolve_weights, weights_mismatch

__all__ = ["InceptionExtractor", "build_inception", "INCEPTION_PREPROCESSING"]

FEATURE_DIM = 2048

INCEPTION_PREPROCESSING = {
    "input": "uint8 NHWC, C=1 (grayscale) or C=3 (RGB)",
    "grayscale": "repeat to 3 channels",
    "resize": {
        "size": [299, 299],
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


def build_network(state_dict: dict[str, torch.Tensor]):
    """torch-fidelity's FID Inception-v3 returning pool3 features, with ``state_dict`` loaded (strict)."""
    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    buffer = io.BytesIO()
    torch.save(state_dict, buffer)  # tensors only: re-serialised from a weights_only load
    buffer.seek(0)
    return FeatureExtractorInceptionV3(
        "inception-v3-compat", ["2048"], feature_extractor_weights_path=buffer
    )


class InceptionExtractor(Extractor):
    """FID Inception-v3 pool3 features (torch backend only)."""

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
    ):
        if backend != "torch":
            raise ValueError(
                f"the inception extractor has only the 'torch' backend, got {backend!r}"
            )
        self.backend = backend
        self.device = resolve_device(device)
        path = (
            Path(weights_path)
            if weights_path is not None
            else resolve_weights(
                WEIGHTS["inception"], cache_dir, offline=offline, lockfile=lockfile
            )
        )
        self._weights = {"file": path.name, "sha256": file_sha256(path)}
        try:
            network = build_network(load_state_dict(path))
        except RuntimeError as err:  # another network's weights (keys or shapes differ)
            raise weights_mismatch(path, "the FID Inception-v3", err) from None
        self.model = network.to(self.device).eval()

    @property
    def preprocessing(self) -> dict:
        return INCEPTION_PREPROCESSING

    @property
    def weights(self) -> dict:
        return dict(self._weights)

    @property
    def versions(self) -> dict[str, str]:
        return package_versions("torch", "torch-fidelity")

    def forward_batch(self, images: np.ndarray) -> np.ndarray:
        images = check_images(images)
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
    """Registry factory for "inception" (kwargs: weights_path, offline, lockfile)."""
    return InceptionExtractor(backend=backend, device=device, cache_dir=cache_dir, **kwargs)
