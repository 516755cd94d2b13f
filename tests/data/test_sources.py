"""load_source over every kind, from files served on 127.0.0.1 in the real formats.

The files come from the same builders as test_readers.py (a CIFAR-10 python tarball,
an ADM npz batch, an AFHQ zip of JPEGs, an FFHQ folder of PNGs); they are fetched
with checksums or the lock file, extracted where the real ones are, and handed to
load_source by artifact name, as the pipeline does.
"""

import io
import zipfile

import numpy as np
import pytest
from PIL import Image
from test_readers import (
    COLOURS,
    FAST,
    cifar_tarball,
    jpeg_bytes,
    md5,
    npz_bytes,
    png_bytes,
    tiny_cifar_batches,
)

import distrank.data.fashion_mnist as fm
from distrank.data import fetch, safe_extract, save_images
from distrank.data.sources import ImageSet, load_source

rng = np.random.default_rng(11)


def bicubic(image, height, width):
    """Independent resize: PIL's bicubic filter on one HWC uint8 image."""
    return np.asarray(Image.fromarray(image).resize((width, height), Image.Resampling.BICUBIC))


# --- npz: ADM batches and the project's image sets -------------------------------------------


@pytest.fixture
def adm_batch(http_server, tmp_path):
    images = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    labels = np.array([7, 3, 7, 1, 3, 7])
    url = http_server.put(
        "diffusion/jul-2021/ref_batches/imagenet/256/VIRTUAL_imagenet256_labeled.npz",
        npz_bytes(arr_0=images, arr_1=labels),
    )
    lock = tmp_path / "resources" / "checksums.lock"
    path = fetch(url, tmp_path / "resources/downloads/imagenet256_ref", lockfile=lock, **FAST)
    return {"imagenet256_ref": str(path)}, images, labels


def test_npz_adm_batch_by_artifact(adm_batch):
    paths, images, labels = adm_batch
    got = load_source({"kind": "npz", "artifact": "imagenet256_ref"}, paths=paths)
    assert isinstance(got, ImageSet) and len(got) == 6
    np.testing.assert_array_equal(got.images, images)
    assert got.labels.dtype == np.int64 and got.labels.tolist() == labels.tolist()
    assert got.label_names is None
    first = load_source(
        {"kind": "npz", "artifact": "imagenet256_ref", "max_images": 2}, paths=paths
    )
    np.testing.assert_array_equal(first.images, images[:2])
    assert first.labels.tolist() == [7, 3]


def test_npz_max_per_class_and_resolution(adm_batch):
    paths, images, labels = adm_batch
    got = load_source(
        {"kind": "npz", "artifact": "imagenet256_ref", "max_per_class": 2, "resolution": [4, 6]},
        paths=paths,
    )
    kept = [0, 1, 2, 3, 4]  # the third 7 (row 5) is dropped; source order is kept
    assert got.labels.tolist() == labels[kept].tolist()
    assert got.images.shape == (5, 4, 6, 3) and got.images.dtype == np.uint8
    for image, row in zip(got.images, kept):
        np.testing.assert_array_equal(image, bicubic(images[row], 4, 6))


def test_npz_samples_by_path_without_labels(tmp_path):
    samples = rng.integers(0, 256, (3, 5, 5, 3), dtype=np.uint8)
    (tmp_path / "my_samples.npz").write_bytes(npz_bytes(arr_0=samples))
    got = load_source({"kind": "npz", "path": str(tmp_path / "my_samples.npz")})
    np.testing.assert_array_equal(got.images, samples)
    assert got.labels is None and got.label_names is None
    images, labels = got  # unpacks like the former (images, labels) tuple
    assert images is got.images and labels is None
    with pytest.raises(ValueError, match="'max_per_class' needs labels"):
        load_source({"kind": "npz", "path": str(tmp_path / "my_samples.npz"), "max_per_class": 1})


def test_npz_project_image_set_with_string_labels(tmp_path):
    images = rng.integers(0, 256, (4, 6, 6, 1), dtype=np.uint8)
    path = save_images(tmp_path / "set.npz", images, np.array(["wild", "cat", "wild", "dog"]))
    got = load_source({"kind": "npz", "path": str(path)})
    np.testing.assert_array_equal(got.images, images)
    assert got.label_names == ("cat", "dog", "wild")
    assert got.labels.tolist() == [2, 0, 2, 1]
    grey = load_source({"kind": "npz", "path": str(path), "resolution": 3})
    assert grey.images.shape == (4, 3, 3, 1)
    np.testing.assert_array_equal(grey.images[1, ..., 0], bicubic(images[1, ..., 0], 3, 3))


def test_npz_errors_name_the_file(tmp_path):
    (tmp_path / "other.npz").write_bytes(npz_bytes(pixels=np.zeros((1, 2, 2, 3), np.uint8)))
    with pytest.raises(KeyError, match=r"other\.npz: neither 'arr_0' .* nor 'images'.*pixels"):
        load_source({"kind": "npz", "path": str(tmp_path / "other.npz")})
    with pytest.raises(IsADirectoryError, match="use kind 'folder'"):
        load_source({"kind": "npz", "path": str(tmp_path)})


# --- CIFAR-10 python tarball -----------------------------------------------------------------


def test_cifar10_by_artifact(http_server, tmp_path):
    batches = tiny_cifar_batches()
    blob = cifar_tarball(batches)
    url = http_server.put("~kriz/cifar-10-python.tar.gz", blob)
    path = fetch(url, tmp_path / "downloads/cifar10_python", md5=md5(blob), size=len(blob), **FAST)
    paths = {"cifar10_python": path}

    train = load_source(
        {"kind": "cifar10", "artifact": "cifar10_python", "split": "train"}, paths=paths
    )
    assert train.images.shape == (20, 32, 32, 3) and train.labels.tolist() == [0, 1, 2, 3] * 5
    assert train.label_names == tuple(f"class{i}" for i in range(10))
    data = batches["data_batch_1"][0]  # rows hold the red, green, blue planes
    assert train.images[2, 3, 4, 1] == data[2, 1024 + 3 * 32 + 4]

    test = load_source(
        {
            "kind": "cifar10",
            "artifact": "cifar10_python",
            "split": "test",
            "max_per_class": 1,
            "max_images": 3,
            "resolution": 16,
        },
        paths=paths,
    )
    assert test.images.shape == (3, 16, 16, 3) and test.labels.tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="needs the key 'split'"):
        load_source({"kind": "cifar10", "artifact": "cifar10_python"}, paths=paths)


# --- AFHQ: zip of JPEGs, a subfolder per class -----------------------------------------------


@pytest.fixture
def afhq(http_server, tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for split, count in (("train", 2), ("val", 1)):
            for animal, colour in COLOURS.items():
                for i in range(count):
                    archive.writestr(
                        f"afhq/{split}/{animal}/flickr_{animal}_{i:06d}.jpg",
                        jpeg_bytes(colour, size=16),
                    )
    url = http_server.put("s/t9l9o3vsx2jai3z/afhq.zip", buffer.getvalue())
    lock = tmp_path / "checksums.lock"
    archive_path = fetch(url + "?dl=1", tmp_path / "downloads/afhq", lockfile=lock, **FAST)
    return {"afhq": safe_extract(archive_path, tmp_path / "downloads/afhq.d")}


def test_afhq_folder_labels_from_subfolders(afhq):
    source = {
        "kind": "folder",
        "artifact": "afhq",
        "subdir": "afhq/train",
        "labels_from_subfolders": True,
    }
    got = load_source(source, paths=afhq)
    assert got.images.shape == (6, 16, 16, 3) and got.images.dtype == np.uint8
    assert got.label_names == ("cat", "dog", "wild")
    assert got.labels.dtype == np.int64 and got.labels.tolist() == [0, 0, 1, 1, 2, 2]
    for image, label in zip(got.images, got.labels):  # JPEG is lossy: compare mean colours
        np.testing.assert_allclose(
            image.reshape(-1, 3).mean(0), COLOURS[got.label_names[label]], atol=3
        )

    one_each = load_source({**source, "max_per_class": 1, "resolution": 8}, paths=afhq)
    assert one_each.labels.tolist() == [0, 1, 2] and one_each.images.shape == (3, 8, 8, 3)
    np.testing.assert_array_equal(one_each.images[1], bicubic(got.images[2], 8, 8))

    # The mapping comes from all classes, so a limit cannot renumber them.
    first = load_source({**source, "max_images": 1}, paths=afhq)
    assert first.labels.tolist() == [0] and first.label_names == ("cat", "dog", "wild")

    # Without labels, every image below the artifact (train and val) in path order.
    everything = load_source({"kind": "folder", "artifact": "afhq"}, paths=afhq)
    assert len(everything) == 9 and everything.labels is None


# --- FFHQ thumbnails: PNGs in chunk folders, a user's path -------------------------------------


def test_ffhq_folder_by_path(http_server, tmp_path):
    faces = rng.integers(0, 256, (5, 12, 12, 3), dtype=np.uint8)
    folder = tmp_path / "thumbnails128x128"
    for i, face in enumerate(faces):
        name = f"{i // 2 * 1000:05d}/{i:05d}.png"
        blob = png_bytes(face)
        fetch(http_server.put(f"ffhq/{name}", blob), folder / name, md5=md5(blob), **FAST)
    got = load_source({"kind": "folder", "path": str(folder)})
    np.testing.assert_array_equal(got.images, faces)  # lossless, in file-name order
    in_workers = load_source({"kind": "folder", "path": str(folder)}, workers=2)
    np.testing.assert_array_equal(in_workers.images, faces)
    assert got.labels is None and got.label_names is None
    small = load_source({"kind": "folder", "path": str(folder), "max_images": 2, "resolution": 6})
    assert small.images.shape == (2, 6, 6, 3)
    np.testing.assert_array_equal(small.images[1], bicubic(faces[1], 6, 6))


def test_folder_of_mixed_sizes_needs_resolution(tmp_path):
    (tmp_path / "a.png").write_bytes(png_bytes(np.full((4, 4, 3), 100, np.uint8)))
    (tmp_path / "b.png").write_bytes(png_bytes(np.full((6, 5, 3), 200, np.uint8)))
    (tmp_path / "c.jpg").write_bytes(jpeg_bytes((10, 20, 30), size=8))
    with pytest.raises(ValueError, match=r"b\.png is 5x6 but .*a\.png is 4x4.*'resolution'"):
        load_source({"kind": "folder", "path": str(tmp_path)})
    got = load_source({"kind": "folder", "path": str(tmp_path), "resolution": 4})
    assert got.images.shape == (3, 4, 4, 3)
    np.testing.assert_array_equal(got.images[1], np.full((4, 4, 3), 200, np.uint8))


def test_folder_errors(tmp_path):
    (tmp_path / "flat.png").write_bytes(png_bytes(np.zeros((4, 4, 3), np.uint8)))
    with pytest.raises(ValueError, match="flat.png is not inside a subfolder"):
        load_source({"kind": "folder", "path": str(tmp_path), "labels_from_subfolders": True})
    with pytest.raises(
        NotADirectoryError, match=r"^folder source .*/nope does not exist or is not a directory$"
    ):
        load_source({"kind": "folder", "path": str(tmp_path), "subdir": "nope"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .* images below"):
        load_source({"kind": "folder", "path": str(tmp_path / "empty")})


# --- Fashion-MNIST (the embedded default) ------------------------------------------------------


@pytest.mark.skipif(
    not all((fm.DEBIAN_DIR / n).is_file() for p in fm.FILES.values() for n in p),
    reason="Debian package dataset-fashion-mnist not installed",
)
def test_fashion_mnist_source():
    got = load_source({"kind": "fashion_mnist", "split": "test", "root": None, "max_images": 5})
    assert got.images.shape == (5, 28, 28, 1) and got.labels.dtype == np.int64
    assert got.label_names[got.labels[0]] == "Ankle boot"  # the first test image


# --- config errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source,paths,error,message",
    [
        ({"kind": "lmdb"}, None, ValueError, "'kind' must be one of"),
        (
            {"kind": "npz", "path": "x.npz", "max_image": 3},
            None,
            ValueError,
            r"unknown key\(s\) \['max_image'\]",
        ),
        (
            {"kind": "npz", "artifact": "ref"},
            {"other": "o.npz"},
            KeyError,
            r"artifact 'ref' has no local path.*passed: other",
        ),
        (
            {"kind": "npz", "artifact": "ref", "path": "x.npz"},
            None,
            ValueError,
            "exactly one of 'artifact'",
        ),
        ({"kind": "folder"}, None, ValueError, "exactly one of 'artifact'"),
        (
            {"kind": "npz", "path": "missing.npz"},
            None,
            FileNotFoundError,
            "missing.npz does not exist",
        ),
        (
            {"kind": "npz", "path": "x.npz", "max_images": 0},
            None,
            ValueError,
            "'max_images' must be a positive integer",
        ),
        (
            {"kind": "npz", "path": "x.npz", "resolution": [4]},
            None,
            ValueError,
            r"'resolution' must be a positive integer or \[height, width\]",
        ),
        (
            {"kind": "npz", "path": "x.npz", "resolution": True},
            None,
            ValueError,
            r"^source key 'resolution' must be a positive integer",
        ),
    ],
)
def test_config_errors(source, paths, error, message):
    with pytest.raises(error, match=message):
        load_source(source, paths=paths)


# --- declared labels (issue 37, item 3) and FFHQ's held-out folder (item 4) --------------------


def test_npz_without_labels_fails_at_once_when_declared_labelled(tmp_path, monkeypatch):
    import distrank.data.sources as sources
    from distrank.data.sources import MissingLabelsError

    path = tmp_path / "VIRTUAL_imagenet256_labeled.npz"
    path.write_bytes(npz_bytes(arr_0=rng.integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)))
    paths = {"imagenet256_ref": str(path)}
    needs = ["partitions.dirichlet", "experiments.E8"]

    def no_reading(*args, **kwargs):
        raise AssertionError("images were read before the labels were checked")

    monkeypatch.setattr(sources, "read_adm_npz", no_reading)
    source = {"kind": "npz", "artifact": "imagenet256_ref", "labels": needs}
    with pytest.raises(MissingLabelsError) as err:
        load_source(source, paths=paths)
    message = str(err.value)
    for fragment in ("artifact 'imagenet256_ref'", "arr_0", "no arr_1", *needs, "kmeans"):
        assert fragment in message
    with pytest.raises(MissingLabelsError, match="labels required"):
        load_source({**source, "labels": True}, paths=paths)


def test_declared_labels_pass_or_are_dropped(adm_batch):
    paths, images, labels = adm_batch
    source = {"kind": "npz", "artifact": "imagenet256_ref"}
    got = load_source({**source, "labels": ["partitions.dirichlet"]}, paths=paths)
    assert got.labels.tolist() == labels.tolist()
    assert load_source({**source, "labels": False}, paths=paths).labels is None
    with pytest.raises(ValueError, match="'labels' must be true, false or a list"):
        load_source({**source, "labels": "yes"}, paths=paths)


def _ffhq_folder(root, counts):
    """FFHQ's layout: folders 00000, 01000, ... of PNGs named by their global index."""
    faces = {}
    for folder, count in counts.items():
        for j in range(count):
            index = int(folder) + j
            face = np.full((4, 4, 3), index % 251, np.uint8)
            (root / folder).mkdir(parents=True, exist_ok=True)
            (root / folder / f"{index:05d}.png").write_bytes(png_bytes(face))
            faces[index] = face
    return faces


def test_ffhq_heldout_folder_is_excluded_by_name_and_counts_checked(tmp_path):
    # An incomplete download: 00000 complete, 01000 short, and the held-out 69000 there.
    _ffhq_folder(tmp_path, {"00000": 3, "01000": 1, "69000": 2})
    reference = {"kind": "folder", "path": str(tmp_path), "exclude": ["69000"]}
    # What max_images used to do: "the first N" lets held-out faces in when folders are short.
    leaky = load_source({"kind": "folder", "path": str(tmp_path), "max_images": 5})
    assert (leaky.images[:, 0, 0, 0] == 69000 % 251).any()
    got = load_source(reference)
    assert got.images[:, 0, 0, 0].tolist() == [0, 1, 2, 1000 % 251]  # no 69000 face
    with pytest.raises(
        ValueError, match=r"expect_images is 5, but it holds 4 images \(without \['69000'\]\)"
    ):
        load_source({**reference, "expect_images": 5})
    assert len(load_source({**reference, "expect_images": 4})) == 4
    heldout = {"kind": "folder", "path": str(tmp_path), "subdir": "69000", "expect_images": 2}
    assert load_source(heldout).images[:, 0, 0, 0].tolist() == [69000 % 251, 69001 % 251]
    with pytest.raises(FileNotFoundError, match="no images left after exclude"):
        load_source({**heldout, "exclude": ["69000.png", "69001.png"], "expect_images": 1})
