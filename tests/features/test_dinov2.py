"""DINOv2 extractor: ViT-S/14 end to end with random Meta-format weights; ViT-L/14 state-dict check only."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("timm")

from distrank.features import get_extractor  # noqa: E402
from distrank.features.dinov2 import (  # noqa: E402
    IMAGENET_MEAN,
    IMAGENET_STD,
    _resample_pos_embed,
    convert_state_dict,
    create_model,
)


@pytest.fixture(scope="module")
def vits14(random_vits14_weights):
    return get_extractor("dinov2_vits14", device="cpu", weights_path=random_vits14_weights)


def test_shape(vits14):
    images = np.random.default_rng(0).integers(0, 256, (2, 28, 28, 1), dtype=np.uint8)
    feats = vits14.extract(images)
    assert feats.shape == (2, 384) and feats.dtype == np.float32 and np.isfinite(feats).all()
    assert vits14.metadata()["d"] == 384 and vits14.metadata()["preprocessing"]["resize"][
        "size"
    ] == [224, 224]


def test_network_input_is_imagenet_normalised_224(vits14):
    seen = []
    proj = vits14.model.patch_embed.proj
    handle = proj.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].detach().clone())
    )
    try:
        vits14.extract(np.full((1, 20, 20, 3), 200, dtype=np.uint8))
    finally:
        handle.remove()
    (x,) = seen
    assert x.shape == (1, 3, 224, 224)
    want = (200 / 255 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)
    np.testing.assert_allclose(
        x[0].numpy().reshape(3, -1), np.repeat(want[:, None], 224 * 224, 1), atol=1e-5
    )


def test_pos_embed_resampled_like_meta(random_vits14_weights):
    state = torch.load(random_vits14_weights, weights_only=True)
    assert state["pos_embed"].shape == (1, 1 + 37 * 37, 384)
    out = _resample_pos_embed(state["pos_embed"], 16)
    assert out.shape == (1, 1 + 16 * 16, 384)
    torch.testing.assert_close(out[:, 0], state["pos_embed"][:, 0])  # CLS slot untouched
    assert _resample_pos_embed(out, 16) is out
    # a constant embedding stays constant (interpolation weights sum to one)
    const = torch.full((1, 1 + 37 * 37, 4), 0.5)
    torch.testing.assert_close(_resample_pos_embed(const, 16), torch.full((1, 257, 4), 0.5))


def test_timm_format_weights_load_too(vits14):
    state = vits14.model.state_dict()  # what timm saves, already at the 224 px grid
    converted = convert_state_dict(state, vits14.model)
    assert set(converted) == set(state)
    assert all(torch.equal(converted[k], state[k]) for k in state)


def test_vitl14_state_dict_converts_without_forward():
    # Meta's ViT-L/14 layout (518 px grid + mask_token), on the meta device: shapes only, no memory.
    big = create_model("dinov2_vitl14", img_size=518, device="meta")
    model = create_model("dinov2_vitl14", device="meta")
    state = dict(big.state_dict())
    state["mask_token"] = torch.zeros(1, 1024, device="meta")
    converted = convert_state_dict(state, model)
    reference = model.state_dict()
    assert set(converted) == set(reference)
    assert all(converted[k].shape == reference[k].shape for k in reference)
    assert converted["pos_embed"].shape == (1, 257, 1024)
    assert model.num_features == 1024 and model.patch_embed.grid_size == (16, 16)
    model.load_state_dict(converted, strict=True, assign=True)


def test_vitl14_offline_missing_weights_fail_fast(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"^offline and dinov2_vitl14_pretrain\.pth is missing: "
    ) as info:
        get_extractor("dinov2_vitl14", cache_dir=tmp_path, offline=True)
    assert "dl.fbaipublicfiles.com" in str(info.value)
