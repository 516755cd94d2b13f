"""Shared fixtures: extractors built once per session (the ONNX export happens once)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # The tests run tiny batches, where thread-pool barriers cost more than they save (on a
    # busy 2-core machine, ~10 ms per parallel op); one thread keeps the suite fast everywhere.
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="session")
def weights_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="session")
def lite0_torch():
    from distrank.features import get_extractor

    return get_extractor("efficientnet_lite0", backend="torch", device="cpu")


@pytest.fixture(scope="session")
def lite0_onnx(weights_dir):
    from distrank.features import get_extractor

    return get_extractor("efficientnet_lite0", backend="onnx", cache_dir=weights_dir, num_threads=1)


@pytest.fixture(scope="session")
def gray_images():
    """Six 28x28 grayscale images with structure (not noise): bars, a disc, gradients."""
    yy, xx = np.mgrid[0:28, 0:28]
    images = [
        np.where(xx < 14, 20, 230),
        np.where(yy % 6 < 3, 0, 255),
        ((xx + yy) * 255 / 54),
        np.where((xx - 14) ** 2 + (yy - 14) ** 2 < 64, 240, 10),
        np.full((28, 28), 127),
        (np.sin(xx / 3.0) * 100 + 128),
    ]
    return np.stack(images).astype(np.uint8)[..., None]


@pytest.fixture(scope="session")
def random_inception_weights(tmp_path_factory):
    """A randomly initialised FID Inception state dict, saved like the real file (torch.save of a dict)."""
    from distrank.features.inception import empty_network

    torch.manual_seed(0)
    net = empty_network()
    # He-normal convolutions keep activations at unit scale through ~50 ReLU layers; torch's
    # default init shrinks them into float32 denormals, which makes CPU convolutions crawl.
    for module in net.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    path = tmp_path_factory.mktemp("inception") / "pt_inception-random.pth"
    torch.save({k: v.clone() for k, v in net.state_dict().items()}, path)
    return path


@pytest.fixture(scope="session")
def random_vits14_weights(tmp_path_factory):
    """A randomly initialised DINOv2 ViT-S/14 in Meta's checkpoint layout (518 px grid, mask_token)."""
    from distrank.features.dinov2 import create_model

    torch.manual_seed(0)
    model = create_model("dinov2_vits14", img_size=518)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["mask_token"] = torch.zeros(1, state["cls_token"].shape[-1])
    path = tmp_path_factory.mktemp("dinov2") / "dinov2_vits14_pretrain.pth"
    torch.save(state, path)
    return path
