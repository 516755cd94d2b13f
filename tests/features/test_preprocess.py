"""Preprocessing against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from distrank.features.efficientnet import PREPROCESSING as LITE0  # noqa: E402
from distrank.features.preprocess import Preprocessing, check_images, resize_matrix  # noqa: E402


def identity(size, interpolation="bilinear", antialias=True, **kw):
    return Preprocessing(
        size=size,
        interpolation=interpolation,
        antialias=antialias,
        mean=(0.0, 0.0, 0.0),
        std=(1.0, 1.0, 1.0),
        **kw,
    )


def test_lite0_constant_image_maps_to_normalised_constant():
    for c in (0, 127, 200, 255):
        images = np.full((2, 28, 28, 1), c, dtype=np.uint8)
        x = LITE0.numpy(images)
        assert x.shape == (2, 3, 128, 128) and x.dtype == np.float32 and x.flags.c_contiguous
        np.testing.assert_allclose(x, (c - 127.0) / 128.0, rtol=0, atol=1e-6)


def test_lite0_grayscale_equals_rgb_with_equal_channels(gray_images):
    rgb = np.repeat(gray_images, 3, axis=-1)
    np.testing.assert_array_equal(LITE0.numpy(gray_images), LITE0.numpy(rgb))


def test_bilinear_upsample_by_hand():
    # 1x2 -> 4 columns, align_corners=False: source x = (j + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25
    # (clamped to the edge): 0, 0.75*0 + 0.25*255, 0.25*0 + 0.75*255, 255
    image = np.array([0, 255], dtype=np.uint8).reshape(1, 1, 2, 1).repeat(2, axis=1)
    x = identity((2, 4)).numpy(image)
    np.testing.assert_allclose(x[0, 0], [[0.0, 63.75, 191.25, 255.0]] * 2, atol=1e-4)


def test_antialiased_downsample_by_hand():
    # 4 -> 2 with a triangle filter of support 2: output 0 centred at input 1.0 weighs inputs
    # 0,1,2 by 0.75,0.75,0.25 (normalised: 3/7, 3/7, 1/7); output 1 weighs 1,2,3 by 1/7, 3/7, 3/7.
    row = np.array([0, 70, 140, 210], dtype=np.uint8)
    image = np.tile(row, (4, 1)).reshape(1, 4, 4, 1)
    x = identity((4, 2)).numpy(image)
    want = [(3 * 0 + 3 * 70 + 140) / 7, (70 + 3 * 140 + 3 * 210) / 7]  # 50, 160
    np.testing.assert_allclose(x[0, 0], [want] * 4, atol=1e-4)


@pytest.mark.parametrize("shape", [(28, 28), (3, 80)])  # matrices; torch-fidelity's own code
def test_tf1_bilinear_by_hand(shape):
    """TensorFlow 1.x bilinear (the FID Inception-v3's): output pixel j reads source position
    j * n_in / n_out, no half-pixel offset, the last pixel repeated past the edge."""

    def tf1(n_in, n_out):
        src = np.arange(n_out) * n_in / n_out
        lo = np.floor(src).astype(int)
        m = np.zeros((n_out, n_in))
        m[np.arange(n_out), lo] += 1 - (src - lo)
        m[np.arange(n_out), np.minimum(lo + 1, n_in - 1)] += src - lo
        return m

    image = np.random.default_rng(1).integers(0, 256, (1, *shape, 1), dtype=np.uint8)
    x = identity((299, 299), "bilinear_tf1", antialias=False).numpy(image)
    want = tf1(shape[0], 299) @ image[0, :, :, 0].astype(np.float64) @ tf1(shape[1], 299).T
    # float32 source positions (TF's and torch-fidelity's) move a weight by up to ~1e-5
    np.testing.assert_allclose(x[0, 1], want, rtol=0, atol=255 * 1e-5)
    assert x[0, 0, 0, 0] == image[0, 0, 0, 0] and x[0, 0, -1, -1] == image[0, -1, -1, 0]


@pytest.mark.parametrize(
    "interpolation,antialias,shape,size",
    [
        ("bilinear", True, (28, 28), (128, 128)),
        ("bilinear", True, (64, 48), (32, 40)),
        ("bicubic", True, (28, 28), (224, 224)),
        ("bicubic", True, (100, 90), (50, 60)),
        ("bicubic", False, (30, 30), (45, 45)),
    ],
)
def test_resize_equals_torch_interpolate(interpolation, antialias, shape, size):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (3, *shape, 3), dtype=np.uint8)
    got = identity(size, interpolation, antialias).numpy(images)
    want = F.interpolate(
        torch.from_numpy(images).permute(0, 3, 1, 2).float(),
        size=size,
        mode=interpolation,
        antialias=antialias,
        align_corners=False,
    ).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4)


def test_resize_matrix_rows_sum_to_one():
    for args in (
        (28, 128, "bilinear", True),
        (512, 224, "bicubic", True),
        (7, 3, "bicubic", False),
    ):
        np.testing.assert_allclose(resize_matrix(*args).sum(axis=1), 1.0, atol=1e-6)


def test_round_to_uint8_and_normalisation_per_channel():
    pre = Preprocessing(
        size=(3, 3),
        interpolation="bicubic",
        antialias=True,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        scale=1 / 255,
        round_to_uint8=True,
    )
    images = np.array([0, 255], dtype=np.uint8).reshape(1, 1, 2, 1).repeat(2, axis=1)
    x = pre.numpy(images)
    pixels = x * np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1) + np.array(
        [0.485, 0.456, 0.406]
    ).reshape(1, 3, 1, 1)
    pixels = pixels * 255
    np.testing.assert_allclose(pixels, np.round(pixels), atol=1e-3)  # integer grey levels
    assert pixels.min() > -1e-3 and pixels.max() < 255 + 1e-3  # bicubic overshoot clamped


def test_numpy_and_torch_paths_agree(gray_images):
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (2, 40, 30, 3), dtype=np.uint8)
    large = rng.integers(0, 256, (2, 80, 70, 3), dtype=np.uint8)  # resized by F.interpolate
    assert LITE0.uses_matrices(40, 30) and not LITE0.uses_matrices(80, 70)
    for images in (gray_images, rgb, large):
        np.testing.assert_allclose(
            LITE0.torch(images, "cpu").numpy(), LITE0.numpy(images), atol=1e-5
        )
    assert isinstance(LITE0(gray_images), torch.Tensor)


def test_preprocessing_dict_is_json_and_complete():
    import json

    d = json.loads(json.dumps(LITE0.to_dict()))
    assert d["resize"] == {
        "size": [128, 128],
        "interpolation": "bilinear",
        "antialias": True,
        "align_corners": False,
        "round_to_uint8": False,
        "implementation": d["resize"]["implementation"],
    }
    assert d["normalize"]["mean"] == [127.0] * 3 and d["normalize"]["std"] == [128.0] * 3


@pytest.mark.parametrize(
    "bad,message",
    [
        (np.zeros((2, 8, 8, 1), dtype=np.float32), r"^images must have dtype uint8, got float32$"),
        (
            np.zeros((8, 8, 1), dtype=np.uint8),
            r"^images must have shape \(N, H, W, C\) with C = 1 or 3, got \(8, 8, 1\)$",
        ),
        (np.zeros((2, 8, 8, 4), dtype=np.uint8), "C = 1 or 3"),
        (np.zeros((2, 3, 8, 8), dtype=np.uint8), "C = 1 or 3"),
    ],
)
def test_check_images_rejects(bad, message):
    with pytest.raises(ValueError, match=message):
        check_images(bad)
    with pytest.raises(TypeError):
        check_images([[1, 2]])


def test_invalid_settings():
    with pytest.raises(ValueError, match=r"^interpolation must be one of "):
        Preprocessing(
            size=(8, 8), interpolation="lanczos", antialias=True, mean=(0,) * 3, std=(1,) * 3
        )
    with pytest.raises(ValueError, match=r"^interpolation 'bilinear_tf1' has no antialiased"):
        Preprocessing(
            size=(8, 8), interpolation="bilinear_tf1", antialias=True, mean=(0,) * 3, std=(1,) * 3
        )
    with pytest.raises(ValueError, match=r"^mean and std must have 3 entries"):
        Preprocessing(
            size=(8, 8), interpolation="bilinear", antialias=True, mean=(0,) * 3, std=(0, 1, 1)
        )


def test_out_buffer_reuse(gray_images):
    rgb = np.random.default_rng(3).integers(0, 256, (len(gray_images), 28, 28, 3), dtype=np.uint8)
    buffer = np.full((len(gray_images), 3, 128, 128), np.nan, dtype=np.float32)
    for images in (gray_images, rgb, gray_images):
        got = LITE0.numpy(images, out=buffer)
        assert got is buffer
        np.testing.assert_array_equal(got, LITE0.numpy(images))
    with pytest.raises(ValueError, match="out must be"):
        LITE0.numpy(gray_images, out=np.empty((1, 3, 128, 128), dtype=np.float32))
