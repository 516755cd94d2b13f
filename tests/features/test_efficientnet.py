"""EfficientNet-Lite0: real weights, pooled features, torch and ONNX backends."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("efficientnet_lite_pytorch")

from distrank.features import available_extractors, get_extractor  # noqa: E402
from distrank.features.efficientnet import (  # noqa: E402
    PooledLite0,
    lite0_preprocessing,
    lite0_weights_path,
    load_lite0,
)

DAISY, PALACE = 985, 698  # ImageNet class indices


def sklearn_photo(name: str, size: int) -> np.ndarray:
    """A centre-cropped photo shipped with scikit-learn, as uint8 (1, size, size, 3)."""
    from PIL import Image
    from sklearn.datasets import load_sample_image

    image = Image.fromarray(load_sample_image(name))
    w, h = image.size
    s = min(w, h)
    image = image.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s))
    return np.asarray(image.resize((size, size), Image.BILINEAR))[None]


def test_registry_names():
    assert {"efficientnet_lite0", "inception", "dinov2_vitl14"} <= set(available_extractors())
    with pytest.raises(ValueError, match="unknown extractor"):
        get_extractor("resnet50")
    with pytest.raises(ValueError, match=r"^backend must be one of "):
        get_extractor("efficientnet_lite0", backend="tensorrt")


def test_weights_load_with_weights_only():
    path = lite0_weights_path()
    state = torch.load(path, map_location="cpu", weights_only=True)
    assert state["_fc.weight"].shape == (1000, 1280) and len(state) == 296
    assert path.name == "efficientnet-lite0-57934424.pth"


def test_classifier_is_the_real_imagenet_one():
    # Real photos, the network's native 224 px, the TF-Lite normalisation: a daisy and a palace.
    pytest.importorskip("sklearn")
    net = load_lite0(224)
    photos = np.concatenate([sklearn_photo("flower.jpg", 224), sklearn_photo("china.jpg", 224)])
    with torch.inference_mode():
        flower, china = net(lite0_preprocessing(224)(photos)).softmax(-1)
    assert int(flower.argmax()) == DAISY
    assert PALACE in china.topk(3).indices.tolist()
    # logits of a random-weights network would be near uniform; these are confident
    assert float(flower.max()) > 0.15 and float(china.max()) > 0.25


def test_pooled_features_are_what_the_classifier_reads(lite0_torch, gray_images):
    net = lite0_torch.model.net
    with torch.inference_mode():
        x = lite0_torch.preprocess(gray_images)
        logits = net(x)
    feats = lite0_torch.extract(gray_images)
    np.testing.assert_allclose(
        net._fc(torch.from_numpy(feats)).numpy(), logits.numpy(), rtol=1e-4, atol=1e-4
    )


def test_shapes_dtype_determinism(lite0_torch, gray_images):
    images = gray_images[:4]
    a = lite0_torch.extract(images, batch_size=2)
    b = lite0_torch.extract(images, batch_size=2)
    assert a.shape == (4, 1280) and a.dtype == np.float32
    assert np.isfinite(a).all() and (a >= 0).all()  # ReLU6 activations, averaged
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(lite0_torch.extract(images, batch_size=4), a, rtol=1e-5, atol=1e-5)
    assert np.abs(a[0] - a[1]).max() > 1e-2  # distinct images, distinct features
    assert lite0_torch.extract(images[:0]).shape == (0, 1280)


def test_network_input_is_the_documented_preprocessing(lite0_torch):
    seen = []
    stem = lite0_torch.model.net._conv_stem
    handle = stem.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].detach().clone())
    )
    try:
        lite0_torch.extract(np.full((1, 28, 28, 1), 200, dtype=np.uint8))
    finally:
        handle.remove()
    (x,) = seen
    assert x.shape == (1, 3, 128, 128)
    np.testing.assert_allclose(x.numpy(), (200 - 127) / 128, atol=1e-6)


def test_onnx_matches_torch(lite0_torch, lite0_onnx, gray_images):
    rgb = np.random.default_rng(0).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    for images in (gray_images, rgb):
        want = lite0_torch.extract(images)
        got = lite0_onnx.extract(images, batch_size=4)
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=5e-5)
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-5
    # onnxruntime is bitwise reproducible, whatever the batch size
    np.testing.assert_array_equal(
        lite0_onnx.extract(gray_images, batch_size=4),
        lite0_onnx.extract(gray_images, batch_size=len(gray_images)),
    )


def test_onnx_export_is_cached(lite0_onnx, weights_dir):
    path = lite0_onnx.onnx_path
    assert path.parent == weights_dir / "onnx" and path.suffix == ".onnx"
    assert path.name.split("-")[:3] == ["efficientnet_lite0", "128px", "57934424"]
    mtime = os.stat(path).st_mtime_ns
    again = get_extractor("efficientnet_lite0", backend="onnx", cache_dir=weights_dir)
    assert again.onnx_path == path and os.stat(path).st_mtime_ns == mtime
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_onnx_backend_is_cpu_only(weights_dir):
    with pytest.raises(ValueError, match=r"^the onnx backend runs on the CPU"):
        get_extractor("efficientnet_lite0", backend="onnx", device="cuda", cache_dir=weights_dir)


def test_metadata(lite0_torch, lite0_onnx):
    for ex in (lite0_torch, lite0_onnx):
        meta = json.loads(json.dumps(ex.metadata()))
        assert meta["extractor"] == "efficientnet_lite0" and meta["d"] == 1280
        assert meta["weights"]["sha256"].startswith("57934424")
        assert meta["preprocessing"]["resize"]["size"] == [128, 128]
        assert meta["precision"] == "float32" and meta["device"] == "cpu"
    assert (
        lite0_torch.metadata()["backend"] == "torch" and "onnxruntime" not in lite0_torch.versions
    )
    assert lite0_onnx.metadata()["backend"] == "onnx" and "onnxruntime" in lite0_onnx.versions


def test_pooled_module_is_plain_average_of_last_feature_map(lite0_torch):
    net = lite0_torch.model.net
    x = torch.randn(1, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        np.testing.assert_allclose(
            PooledLite0(net)(x).numpy(),
            net.extract_features(x).mean((2, 3)).numpy(),
            rtol=1e-5,
            atol=1e-6,
        )


def test_unusable_onnx_cache_is_exported_again(lite0_onnx, tmp_path, gray_images):
    broken = tmp_path / "onnx" / lite0_onnx.onnx_path.name
    broken.parent.mkdir()
    broken.write_bytes(b"not an onnx graph")
    ex = get_extractor("efficientnet_lite0", backend="onnx", cache_dir=tmp_path)
    assert ex.onnx_path == broken and broken.stat().st_size > 1_000_000
    np.testing.assert_array_equal(ex.extract(gray_images[:2]), lite0_onnx.extract(gray_images[:2]))
