"""Full-scale formats end to end: served over HTTP, fetched, extracted, read.

Tiny files in the exact formats of the real ones: a CIFAR-10 python tarball,
an ADM (guided-diffusion) npz batch, an AFHQ zip of JPEGs, an FFHQ folder of
PNGs; plus the project's own npz image-set format.
"""

import hashlib
import io
import json
import os
import pickle
import struct
import tarfile
import zipfile

import numpy as np
import pytest
from PIL import Image

from distrank.data import (
    UnsafePickleError,
    cifar10_label_names,
    fetch,
    load_image_meta,
    load_images,
    read_adm_npz,
    read_cifar10_python,
    read_image_folder,
    safe_extract,
    save_images,
)
from distrank.data.readers import RestrictedUnpickler

FAST = {"backoff": 0.0, "timeout": 5, "allow_http": True}  # the local server is plain http
rng = np.random.default_rng(7)


def md5(data):
    return hashlib.md5(data).hexdigest()


# --- CIFAR-10 python tarball ---------------------------------------------------------------


class Py2Pickler(pickle._Pickler):  # the pure-Python pickler lets us override opcodes
    """Writes str and bytes as Python 2 byte strings (SHORT_BINSTRING/BINSTRING), as cPickle did."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_string(self, obj):
        data = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[str] = dispatch[bytes] = save_py2_string


def py2_style_pickle(obj):
    """Protocol 2, byte strings and numpy 1.x global names: the layout of the real batch files."""
    buffer = io.BytesIO()
    Py2Pickler(buffer, protocol=2).dump(obj)
    data = buffer.getvalue().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in data and b"_codecs" not in data
    return data


def cifar_tarball(batches, *, members=None):
    """batches: name -> (data (N,3072) uint8, labels list). Returns the .tar.gz bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        payloads = {
            name: py2_style_pickle(
                {b"batch_label": name.encode(), b"labels": labels, b"data": data, b"filenames": []}
            )
            for name, (data, labels) in batches.items()
        }
        payloads["batches.meta"] = pickle.dumps(
            {b"label_names": [f"class{i}".encode() for i in range(10)], b"num_vis": 3072}
        )
        payloads.update(members or {})
        for name, payload in payloads.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def tiny_cifar_batches():
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    return {
        name: (rng.integers(0, 256, (4, 3072), dtype=np.uint8), [i % 10 for i in range(4)])
        for name in names
    }


def test_cifar10_tarball_downloaded_and_read(http_server, tmp_path):
    batches = tiny_cifar_batches()
    blob = cifar_tarball(batches)
    url = http_server.put("~kriz/cifar-10-python.tar.gz", blob)
    tar_path = fetch(
        url, tmp_path / "cifar-10-python.tar.gz", md5=md5(blob), size=len(blob), **FAST
    )

    images, labels = read_cifar10_python(tar_path, "train")
    assert images.shape == (20, 32, 32, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and labels.tolist() == [0, 1, 2, 3] * 5
    data = batches["data_batch_2"][0]  # rows: 1024 red, 1024 green, 1024 blue, row-major
    for n, y, x, c in [(0, 0, 0, 0), (1, 5, 7, 1), (3, 31, 31, 2), (2, 0, 31, 2)]:
        assert images[4 + n, y, x, c] == data[n, c * 1024 + y * 32 + x]

    test_images, _ = read_cifar10_python(tar_path, "test")
    assert test_images.shape == (4, 32, 32, 3)
    assert cifar10_label_names(tar_path) == [f"class{i}" for i in range(10)]

    # The same tarball also goes through safe extraction.
    extracted = safe_extract(tar_path, tmp_path / "cifar")
    assert sorted(p.name for p in (extracted / "cifar-10-batches-py").iterdir()) == sorted(
        [*batches, "batches.meta"]
    )


def test_cifar10_reads_python3_pickles_too(tmp_path):
    batches = tiny_cifar_batches()
    modern = {
        "test_batch": pickle.dumps(
            {b"data": batches["test_batch"][0], b"labels": batches["test_batch"][1]}, protocol=5
        )
    }
    (tmp_path / "c.tar.gz").write_bytes(cifar_tarball(batches, members=modern))
    images, labels = read_cifar10_python(tmp_path / "c.tar.gz", "test")
    assert images[1, 2, 3, 0] == batches["test_batch"][0][1, 2 * 32 + 3]
    assert labels.tolist() == batches["test_batch"][1]


class Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_malicious_pickle_in_tarball_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    batches = tiny_cifar_batches()
    evil = {"data_batch_3": pickle.dumps({b"data": Exploit(marker), b"labels": []})}
    (tmp_path / "c.tar.gz").write_bytes(cifar_tarball(batches, members=evil))
    with pytest.raises(
        UnsafePickleError,
        match=r"data_batch_3: refusing to load global (posix|nt)"
        r"\.system",
    ):
        read_cifar10_python(tmp_path / "c.tar.gz", "train")
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        b"cbuiltins\neval\n(S'1+1'\ntR.",  # protocol 0 GLOBAL
        pickle.dumps(print),  # a function by reference
        pickle.dumps(Exploit("x")),  # reduce to os.system
        b"\x80\x02cnumpy\nload\nq\x00.",  # numpy, but not an allowed name
    ],
)
def test_restricted_unpickler_refuses_globals(payload):
    with pytest.raises(UnsafePickleError, match="refusing to load global"):
        RestrictedUnpickler(io.BytesIO(payload), source="x").load()


def test_restricted_unpickler_builds_arrays_and_containers():
    obj = {b"a": np.arange(6, dtype=np.uint8).reshape(2, 3), b"s": {1, 2}, b"f": np.float64(2.5)}
    for protocol in (2, 5):
        loaded = RestrictedUnpickler(io.BytesIO(pickle.dumps(obj, protocol=protocol))).load()
        np.testing.assert_array_equal(loaded[b"a"], obj[b"a"])
        assert loaded[b"s"] == {1, 2} and loaded[b"f"] == 2.5


# --- ADM / guided-diffusion npz batches -------------------------------------------------------


def npz_bytes(**arrays):
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_adm_npz_downloaded_with_lockfile_and_read(http_server, tmp_path):
    images = rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5, 9])
    url = http_server.put(
        "diffusion/jul-2021/ref_batches/imagenet/256/VIRTUAL_imagenet256_labeled.npz",
        npz_bytes(arr_0=images, arr_1=labels),
    )
    lock = tmp_path / "checksums.lock"  # no hash is published for these batches
    path = fetch(url, tmp_path / "ref.npz", lockfile=lock, **FAST)
    got_images, got_labels = read_adm_npz(path)
    np.testing.assert_array_equal(got_images, images)
    assert got_labels.dtype == np.int64 and got_labels.tolist() == labels.tolist()
    first, first_labels = read_adm_npz(path, max_images=2)
    np.testing.assert_array_equal(first, images[:2])
    assert first_labels.tolist() == [3, 1]
    assert url in json.loads(lock.read_text())


def test_adm_sample_batch_without_labels(tmp_path):
    images = rng.integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)
    (tmp_path / "samples.npz").write_bytes(npz_bytes(arr_0=images))
    got, labels = read_adm_npz(tmp_path / "samples.npz", max_images=10)
    np.testing.assert_array_equal(got, images)
    assert labels is None


@pytest.mark.parametrize(
    "arrays,error,message",
    [
        ({"images": np.zeros((1, 2, 2, 3), np.uint8)}, KeyError, "no 'arr_0'.*images"),
        ({"arr_0": np.zeros((1, 2, 2, 3), np.float32)}, ValueError, "arr_0.*uint8"),
        ({"arr_0": np.zeros((1, 2, 2, 4), np.uint8)}, ValueError, r"arr_0.*C in \{1, 3\}"),
        ({"arr_0": np.array([None, 1], dtype=object)}, ValueError, "object arrays"),
    ],
)
def test_adm_npz_errors_name_file_and_key(tmp_path, arrays, error, message):
    path = tmp_path / "bad.npz"
    if any(a.dtype == object for a in arrays.values()):
        np.savez(path, **arrays)  # writing object arrays uses pickle; reading must refuse
    else:
        path.write_bytes(npz_bytes(**arrays))
    with pytest.raises(error, match=message) as info:
        read_adm_npz(path)
    assert info.value.args[0].startswith(f"{path}")  # the message names the file first


# --- AFHQ: a zip of JPEGs, one subfolder per class -------------------------------------------

COLOURS = {"cat": (200, 30, 30), "dog": (30, 200, 30), "wild": (30, 30, 200)}


def jpeg_bytes(colour, size=16):
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def test_afhq_zip_downloaded_extracted_read(http_server, tmp_path):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for split, count in (("train", 2), ("val", 1)):
            for animal, colour in COLOURS.items():
                for i in range(count):
                    archive.writestr(
                        f"afhq/{split}/{animal}/{animal}_{i:04d}.jpg", jpeg_bytes(colour)
                    )
        archive.writestr("__MACOSX/afhq/train/cat/._cat_0000.jpg", b"resource fork, not a jpeg")
    # Dropbox-style: a query string and a redirect to the real location.
    http_server.put("content/afhq.zip", buffer.getvalue())
    http_server.redirects["/s/t9l9o3vsx2jai3z/afhq.zip"] = "/content/afhq.zip"
    url = http_server.url("s/t9l9o3vsx2jai3z/afhq.zip?dl=1")
    lock = tmp_path / "checksums.lock"
    archive_path = fetch(url, tmp_path / "afhq.zip", lockfile=lock, **FAST)
    root = safe_extract(archive_path, tmp_path / "afhq")

    images, labels = read_image_folder(root / "afhq" / "train", labels_from_subfolders=True)
    assert images.shape == (6, 16, 16, 3) and images.dtype == np.uint8
    assert labels.tolist() == ["cat", "cat", "dog", "dog", "wild", "wild"]
    for image, label in zip(images, labels):  # JPEG is lossy: compare mean colours
        np.testing.assert_allclose(image.reshape(-1, 3).mean(0), COLOURS[label], atol=3)
    val_images, val_labels = read_image_folder(root / "afhq" / "val", labels_from_subfolders=True)
    assert val_images.shape == (3, 16, 16, 3) and sorted(val_labels) == ["cat", "dog", "wild"]


# --- FFHQ thumbnails: a folder of PNGs in chunk subfolders ----------------------------------------


def png_bytes(pixels):
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_ffhq_png_folder_downloaded_and_read(http_server, tmp_path):
    faces = rng.integers(0, 256, (5, 12, 12, 3), dtype=np.uint8)
    folder = tmp_path / "thumbnails128x128"
    for i, face in enumerate(faces):  # FFHQ layout: 00000/00000.png, 01000/01000.png, ...
        name = f"{i // 2 * 1000:05d}/{i:05d}.png"
        blob = png_bytes(face)
        url = http_server.put(f"ffhq/thumbnails128x128/{name}", blob)
        fetch(url, folder / name, md5=md5(blob), **FAST)  # per-file md5 as in ffhq-dataset-v2.json
    images, labels = read_image_folder(folder)
    np.testing.assert_array_equal(images, faces)  # PNG is lossless, order is by file name
    assert labels is None
    grey, _ = read_image_folder(folder, mode="L", max_images=2)
    assert grey.shape == (2, 12, 12, 1)
    expected = np.asarray(Image.fromarray(faces[0]).convert("L"))
    np.testing.assert_array_equal(grey[0, ..., 0], expected)


def test_image_folder_errors(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.png").write_bytes(png_bytes(np.zeros((4, 4, 3), np.uint8)))
    (tmp_path / "a" / "y.png").write_bytes(png_bytes(np.zeros((5, 4, 3), np.uint8)))
    with pytest.raises(ValueError, match=r"y\.png is 4x5 .* share one size"):
        read_image_folder(tmp_path)
    (tmp_path / "a" / "y.png").unlink()
    (tmp_path / "flat.png").write_bytes(png_bytes(np.zeros((4, 4, 3), np.uint8)))
    with pytest.raises(ValueError, match="flat.png is not inside a subfolder"):
        read_image_folder(tmp_path, labels_from_subfolders=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match="cannot decode image .*broken.jpg"):
        read_image_folder(tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="no .* images"):
        read_image_folder(tmp_path / "b", extensions=(".webp",))
    with pytest.raises(NotADirectoryError):
        read_image_folder(tmp_path / "missing")


# --- the project's image-set npz ------------------------------------------------------------------


def test_image_set_round_trip(tmp_path):
    images = rng.integers(0, 256, (4, 6, 6, 3), dtype=np.uint8)
    path = save_images(
        tmp_path / "sets" / "real.npz",
        images,
        np.array([0, 1, 1, 2], np.int32),
        source="unit test",
        seed=3,
    )
    got, labels = load_images(path)
    np.testing.assert_array_equal(got, images)
    assert labels.dtype == np.int64 and labels.tolist() == [0, 1, 1, 2]
    assert load_image_meta(path) == {"seed": 3, "source": "unit test"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["real.npz"]  # no temp file left


def test_image_set_grayscale_string_labels_and_compression(tmp_path):
    images = rng.integers(0, 256, (3, 5, 5), dtype=np.uint8)
    path = save_images(tmp_path / "g.npz", images, np.array(["cat", "dog", "cat"]), compress=True)
    got, labels = load_images(path)
    assert got.shape == (3, 5, 5, 1) and labels.tolist() == ["cat", "dog", "cat"]
    assert load_image_meta(path) == {}
    got, labels = load_images(save_images(tmp_path / "n.npz", images))
    assert labels is None


@pytest.mark.parametrize(
    "images,labels,message",
    [
        (np.zeros((2, 4, 4, 3), np.float32), None, r"x\.npz: expected dtype uint8, got float32$"),
        (np.zeros((2, 4, 4, 2), np.uint8), None, r"C in \{1, 3\}"),
        (np.zeros((2, 4, 4, 3), np.uint8), np.array([1]), r"labels must have shape \(2,\)"),
        (np.zeros((2, 4, 4, 3), np.uint8), np.array([0.5, 1.5]), "integers or strings"),
    ],
)
def test_save_images_validates(tmp_path, images, labels, message):
    with pytest.raises(ValueError, match=message):
        save_images(tmp_path / "x.npz", images, labels)
    assert not (tmp_path / "x.npz").exists()


def test_load_images_errors_name_file_and_key(tmp_path):
    np.savez(tmp_path / "nokey.npz", pixels=np.zeros((1, 2, 2, 3), np.uint8))
    with pytest.raises(KeyError, match=r"nokey\.npz: no 'images' array \(keys: pixels\)"):
        load_images(tmp_path / "nokey.npz")
    np.savez(tmp_path / "labels.npz", images=np.zeros((2, 2, 2, 3), np.uint8), labels=np.zeros(3))
    with pytest.raises(ValueError, match=r"labels\.npz key 'labels'"):
        load_images(tmp_path / "labels.npz")
    np.savez(tmp_path / "obj.npz", images=np.array([None], dtype=object))
    with pytest.raises(ValueError, match=r"obj\.npz key 'images' cannot be read without pickle"):
        load_images(tmp_path / "obj.npz")
    (tmp_path / "junk.npz").write_bytes(b"junk")
    with pytest.raises(ValueError, match="junk.npz is not a readable npz"):
        load_images(tmp_path / "junk.npz")
    with pytest.raises(FileNotFoundError, match=r"^image set .*/missing\.npz does not exist$"):
        load_images(tmp_path / "missing.npz")
