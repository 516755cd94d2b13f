"""Fashion-MNIST loader: the real Debian files, tiny hand-written IDX files, the download path."""

import gzip
import hashlib
import struct

import numpy as np
import pytest

from distrank.data import fashion_mnist as fm
from distrank.data.fashion_mnist import find_fashion_mnist, load_fashion_mnist, read_idx

HAVE_DEBIAN = all((fm.DEBIAN_DIR / name).is_file() for pair in fm.FILES.values() for name in pair)
needs_debian = pytest.mark.skipif(
    not HAVE_DEBIAN, reason=f"Debian package dataset-fashion-mnist not installed ({fm.DEBIAN_DIR})"
)


def independent_parse(name, offset):
    """The usual one-liner, independent of the loader's IDX parser."""
    return np.frombuffer(gzip.open(fm.DEBIAN_DIR / name).read(), np.uint8, offset=offset)


@needs_debian
def test_debian_train_split():
    images, labels = load_fashion_mnist("train")  # verify=True: decompressed md5s match upstream
    assert images.shape == (60_000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (60_000,) and labels.dtype == np.int64
    assert np.bincount(labels).tolist() == [6_000] * 10
    reference = independent_parse("train-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
    for i, row, col in [(0, 0, 0), (0, 14, 14), (1234, 10, 20), (59_999, 27, 27)]:
        assert images[i, row, col] == reference[i, row, col]
    np.testing.assert_array_equal(images, reference)
    np.testing.assert_array_equal(labels, independent_parse("train-labels-idx1-ubyte.gz", 8))
    assert labels[0] == 9  # the first training image is an ankle boot
    assert fm.CLASS_NAMES[labels[0]] == "Ankle boot"


@needs_debian
def test_debian_test_and_all_splits():
    test_images, test_labels = load_fashion_mnist("test")
    assert test_images.shape == (10_000, 28, 28)
    assert np.bincount(test_labels).tolist() == [1_000] * 10
    np.testing.assert_array_equal(test_labels, independent_parse("t10k-labels-idx1-ubyte.gz", 8))
    all_images, all_labels = load_fashion_mnist("all")
    assert all_images.shape == (70_000, 28, 28) and all_labels.shape == (70_000,)
    np.testing.assert_array_equal(all_images[60_000:], test_images)


@needs_debian
def test_debian_copy_is_recompressed_but_identical():
    """Why the loader checks decompressed md5s: the .gz bytes differ from upstream's."""
    for name, raw_md5 in fm.RAW_MD5.items():
        data = (fm.DEBIAN_DIR / name).read_bytes()
        assert hashlib.md5(gzip.decompress(data)).hexdigest() == raw_md5
    assert find_fashion_mnist() == fm.DEBIAN_DIR


# --- tiny IDX files written by hand -------------------------------------------------------


def idx_bytes(array, type_code=0x08):
    header = struct.pack(">HBB", 0, type_code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(">u1").tobytes()


def write_tiny_dataset(directory, *, gz=True, n_train=5, n_test=3):
    rng = np.random.default_rng(0)
    arrays = {}
    for split, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        arrays[split] = images, labels
        for name, array in zip(fm.FILES[split], (images, labels)):
            data = idx_bytes(array)
            if gz:
                (directory / name).write_bytes(gzip.compress(data))
            else:
                (directory / name[:-3]).write_bytes(data)
    return arrays


@pytest.mark.parametrize("gz", [True, False])
def test_tiny_idx_files(tmp_path, gz):
    arrays = write_tiny_dataset(tmp_path, gz=gz)
    for split in ("train", "test"):
        images, labels = load_fashion_mnist(split, root=tmp_path, verify=False)
        np.testing.assert_array_equal(images, arrays[split][0])
        np.testing.assert_array_equal(labels, arrays[split][1])
        assert labels.dtype == np.int64
    images, labels = load_fashion_mnist("all", root=tmp_path, verify=False)
    assert images.shape == (8, 28, 28) and labels.shape == (8,)


def test_verification_rejects_files_that_are_not_the_release(tmp_path):
    write_tiny_dataset(tmp_path)
    with pytest.raises(ValueError, match="not the Fashion-MNIST release: md5"):
        load_fashion_mnist("train", root=tmp_path)


def test_missing_files_in_root_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.gz"):
        load_fashion_mnist("train", root=tmp_path)


def test_bad_split():
    with pytest.raises(ValueError, match="split must be"):
        load_fashion_mnist("validation")


def test_idx_parser_values_and_dtypes(tmp_path):
    array = (np.arange(24).reshape(2, 3, 4) - 5).astype(">i4")
    header = struct.pack(">HBB", 0, 0x0C, 3) + struct.pack(">3I", 2, 3, 4)
    (tmp_path / "x.idx").write_bytes(header + array.tobytes())
    parsed = read_idx(tmp_path / "x.idx")
    assert parsed.dtype == np.int32 and parsed.dtype.isnative
    np.testing.assert_array_equal(parsed, array)


@pytest.mark.parametrize(
    "data,message",
    [
        (b"\x00\x00", "too short"),
        (b"\x01\x02\x08\x01" + b"\x00" * 8, "not an IDX file"),
        (b"\x00\x00\x08\x01\x00\x00\x00\x05" + b"\x00" * 4, r"shape \(5,\).*holds 4 bytes"),
        (b"\x00\x00\x08\x02\x00\x00\x00\x01", "truncated IDX header"),
    ],
)
def test_idx_parser_errors(tmp_path, data, message):
    (tmp_path / "bad.idx").write_bytes(data)
    with pytest.raises(ValueError, match=message):
        read_idx(tmp_path / "bad.idx")


def test_idx_wrong_number_of_dimensions(tmp_path):
    write_tiny_dataset(tmp_path)
    # Swap labels in for images: a 1-d file where a 3-d one belongs.
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(
        (tmp_path / "train-labels-idx1-ubyte.gz").read_bytes()
    )
    with pytest.raises(ValueError, match="expected an IDX file with 3 dimensions, found 1"):
        load_fashion_mnist("train", root=tmp_path, verify=False)


# --- download fallback ---------------------------------------------------------------------


def test_download_when_no_local_copy(http_server, tmp_path, monkeypatch):
    monkeypatch.setattr(fm, "DEBIAN_DIR", tmp_path / "no-debian-here")
    source = tmp_path / "source"
    source.mkdir()
    arrays = write_tiny_dataset(source)
    md5s = {}
    for path in source.iterdir():
        http_server.put(f"fashion/{path.name}", path.read_bytes())
        md5s[path.name] = hashlib.md5(path.read_bytes()).hexdigest()

    # The first mirror is down (404), the second serves the files.
    mirrors = (http_server.url("dead/"), http_server.url("fashion/"))
    directory = find_fashion_mnist(
        download_dir=tmp_path / "resources", mirrors=mirrors, md5s=md5s, allow_http=True
    )  # the local server is plain http
    assert directory == tmp_path / "resources"
    images, labels = load_fashion_mnist("test", root=directory, verify=False)
    np.testing.assert_array_equal(images, arrays["test"][0])

    # Wrong published md5: the download is refused and nothing is kept.
    bad = dict(md5s, **{"t10k-labels-idx1-ubyte.gz": "0" * 32})
    with pytest.raises(fm.DownloadError, match="t10k-labels-idx1-ubyte.gz"):
        find_fashion_mnist(
            download_dir=tmp_path / "other", mirrors=mirrors[1:], md5s=bad, allow_http=True
        )
    assert not (tmp_path / "other" / "t10k-labels-idx1-ubyte.gz").exists()


def test_no_local_copy_and_download_disabled(tmp_path, monkeypatch):
    monkeypatch.setattr(fm, "DEBIAN_DIR", tmp_path / "no-debian-here")
    with pytest.raises(FileNotFoundError, match="apt install dataset-fashion-mnist"):
        load_fashion_mnist("train", download_dir=tmp_path / "resources", download=False)


def test_published_checksums_are_the_readme_values():
    # zalandoresearch/fashion-mnist README, "Get the Data"
    assert fm.GZ_MD5 == {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    }
    assert all(m.startswith("https://") for m in fm.MIRRORS)  # fetch refuses plain http
