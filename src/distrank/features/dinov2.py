"""DINOv2 ViT features (CLS token after the final norm), as dgm-eval computes them.

Network: timm's ``vit_{small,base,large}_patch14_dinov2`` (``.lvd142m`` weights)
built with ``img_size=224`` and ``pretrained=False``; no network access
(``HF_HUB_OFFLINE=1`` is set while timm builds it). Weights: Meta's release
(``dinov2_vitl14_pretrain.pth``), from the weights directory or downloaded
(see :mod:`distrank.features.weights`), unpickled with
``torch.load(weights_only=True)``; timm's own state-dict format (as saved by
``model.state_dict()``) loads too.

Meta's checkpoints carry position embeddings for 518 px (37 x 37 patches).
Meta's code interpolates them to the input's grid at every forward pass
(bicubic, no antialiasing, scale factor ``(16 + 0.1) / 37``); the same
interpolation is done here once, at load time, so the 224 px network matches
the one dgm-eval runs through ``torch.hub``.

Preprocessing, following dgm-eval's ``DINOv2Encoder``: resize to 224 x 224
bicubic (torchvision on PIL images: PIL's cubic kernel, antialiased when
shrinking, values rounded to uint8), scale to [0, 1], ImageNet mean/std. Here
the resize uses torch's antialiased bicubic weights (the same a = -0.5 kernel
as PIL) with rounding to uint8; PIL additionally rounds between its two 1-D
passes, so values agree with dgm-eval's to about one grey level, not bit for bit.

Feature dimensions: ViT-S/14 384, ViT-B/14 768, ViT-L/14 1024.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .base import Extractor, full_precision, package_versions, resolve_device
from .preprocess import Preprocessing
from .weights import WEIGHTS, file_sha256, load_state_dict, resolve_weights, weights_mismatch

__all__ = [
    "ARCHITECTURES",
    "DINOv2Extractor",
    "DINOV2_PREPROCESSING",
    "convert_state_dict",
    "build_dinov2_vitl14",
    "create_model",
]

IMAGE_SIZE = 224
PATCH_SIZE = 14
INTERPOLATE_OFFSET = 0.1  # Meta's DINOv2 interpolate_pos_encoding
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# extractor name -> (timm architecture, feature dim)
ARCHITECTURES = {
    "dinov2_vits14": ("vit_small_patch14_dinov2", 384),
    "dinov2_vitb14": ("vit_base_patch14_dinov2", 768),
    "dinov2_vitl14": ("vit_large_patch14_dinov2", 1024),
}

DINOV2_PREPROCESSING = Preprocessing(
    size=(IMAGE_SIZE, IMAGE_SIZE),
    interpolation="bicubic",
    antialias=True,
    mean=IMAGENET_MEAN,
    std=IMAGENET_STD,
    scale=1.0 / 255.0,
    round_to_uint8=True,
)


@contextlib.contextmanager
def _hub_offline():
    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved


def create_model(name: str, img_size: int = IMAGE_SIZE, device: str | torch.device | None = None):
    """The timm DINOv2 architecture for ``name`` without weights (CLS-token output, no head).

    ``device="meta"`` builds it without allocating or initialising parameters.
    """
    import timm

    arch, _ = ARCHITECTURES[name]
    with _hub_offline(), torch.device(device or "cpu"):
        return timm.create_model(arch, pretrained=False, img_size=img_size, num_classes=0)


def _resample_pos_embed(pos_embed: torch.Tensor, grid: int) -> torch.Tensor:
    """Meta's run-time position-embedding interpolation (CLS slot first), done once."""
    n_patches = pos_embed.shape[1] - 1
    side = int(round(n_patches**0.5))
    if side * side != n_patches:
        raise ValueError(f"pos_embed has {n_patches} patch positions, not a square grid")
    if side == grid:
        return pos_embed
    dim = pos_embed.shape[-1]
    dtype = pos_embed.dtype
    pos_embed = pos_embed.float()
    scale = float(grid + INTERPOLATE_OFFSET) / side
    patches = pos_embed[:, 1:].reshape(1, side, side, dim).permute(0, 3, 1, 2)
    patches = F.interpolate(patches, scale_factor=(scale, scale), mode="bicubic", antialias=False)
    if tuple(patches.shape[-2:]) != (grid, grid):
        raise ValueError(f"interpolated grid {tuple(patches.shape[-2:])} != {(grid, grid)}")
    patches = patches.permute(0, 2, 3, 1).reshape(1, grid * grid, dim)
    return torch.cat((pos_embed[:, :1], patches), dim=1).to(dtype)


def convert_state_dict(state_dict: dict[str, torch.Tensor], model) -> dict[str, torch.Tensor]:
    """Meta's (or timm's) DINOv2 state dict -> ``model``'s, position embeddings resampled as Meta does."""
    from timm.models.vision_transformer import checkpoint_filter_fn

    state_dict = dict(state_dict)
    if "pos_embed" in state_dict and "register_tokens" not in state_dict:
        state_dict["pos_embed"] = _resample_pos_embed(
            state_dict["pos_embed"], model.patch_embed.grid_size[0]
        )
    return checkpoint_filter_fn(state_dict, model)


class DINOv2Extractor(Extractor):
    """DINOv2 CLS features at 224 px (torch backend only); see the module docstring."""

    default_batch_size = 32

    def __init__(
        self,
        name: str = "dinov2_vitl14",
        backend: str = "torch",
        device=None,
        cache_dir=None,
        *,
        weights_path: str | Path | None = None,
        offline: bool | None = None,
        lockfile: str | Path | None = None,
    ):
        if name not in ARCHITECTURES:
            raise ValueError(
                f"unknown DINOv2 model {name!r}; choose one of {sorted(ARCHITECTURES)}"
            )
        if backend != "torch":
            raise ValueError(f"the {name} extractor has only the 'torch' backend, got {backend!r}")
        self.name = name
        self.dim = ARCHITECTURES[name][1]
        self.backend = backend
        self.device = resolve_device(device)
        path = (
            Path(weights_path)
            if weights_path is not None
            else resolve_weights(WEIGHTS[name], cache_dir, offline=offline, lockfile=lockfile)
        )
        self._weights = {"file": path.name, "sha256": file_sha256(path)}
        model = create_model(name)
        try:
            model.load_state_dict(convert_state_dict(load_state_dict(path), model), strict=True)
        except RuntimeError as err:  # another network's weights (keys or shapes differ)
            raise weights_mismatch(path, name, err) from None
        self.model = model.to(self.device).eval().requires_grad_(False)

    @property
    def preprocessing(self) -> dict:
        return DINOV2_PREPROCESSING.to_dict()

    @property
    def weights(self) -> dict:
        return dict(self._weights)

    @property
    def versions(self) -> dict[str, str]:
        return package_versions("torch", "timm")

    def forward_batch(self, images: np.ndarray) -> np.ndarray:
        x = DINOV2_PREPROCESSING(images, self.device)
        with torch.inference_mode(), full_precision():
            return self.model(x).float().cpu().numpy()


def _factory(name):
    def build(*, backend: str = "torch", device=None, cache_dir=None, **kwargs) -> DINOv2Extractor:
        return DINOv2Extractor(name, backend=backend, device=device, cache_dir=cache_dir, **kwargs)

    build.__name__ = f"build_{name}"
    build.__doc__ = f'Registry factory for "{name}" (kwargs: weights_path, offline, lockfile).'
    return build


build_dinov2_vits14 = _factory("dinov2_vits14")
build_dinov2_vitb14 = _factory("dinov2_vitb14")
build_dinov2_vitl14 = _factory("dinov2_vitl14")
