"""A user's images on disk (distrank.data.folders): folders, manifests, image npz, batches."""

import numpy as np
import pytest
from PIL import Image

from distrank.data.folders import ImageArchive, ImageFiles, input_kind, open_images

RNG = np.random.default_rng(3)


def write(path, size=(6, 5), mode="RGB", seed=None, **save):
    """An image of `size` (width, height) with random pixels; returns its pixels (H, W, C)."""
    rng = RNG if seed is None else np.random.default_rng(seed)
    channels = 3 if mode == "RGB" else 1
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels if channels == 3 else pixels[..., 0]).save(path, **save)
    return pixels


def rows(image_input, batch_size=2, workers=1):
    """Every row's image, in row order, from the input's batches."""
    out = {}
    for index, batch in image_input.batches(batch_size, workers):
        assert len(index) == len(batch) and batch.dtype == np.uint8 and batch.ndim == 4
        assert batch.shape[3] in (1, 3)
        out.update(zip(index.tolist(), batch))
    assert sorted(out) == list(range(len(image_input)))
    return [out[i] for i in range(len(out))]


def test_folder_is_read_recursively_in_sorted_order_in_every_format(tmp_path):
    # lossless formats only, so the decoded pixels equal what was written
    written = {
        "b/z.png": write(tmp_path / "b/z.png"),
        "a.png": write(tmp_path / "a.png", mode="L"),
        "b/c/y.webp": write(tmp_path / "b/c/y.webp", lossless=True),
        "b/c/x.PNG": write(tmp_path / "b/c/x.PNG"),
    }
    write(tmp_path / ".hidden.png")
    write(tmp_path / "__MACOSX/a.png")
    (tmp_path / "notes.txt").write_text("not an image")
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "lossy.jpg", quality=95)
    image_input, clients = open_images(tmp_path)
    names = [f.relative_to(tmp_path).as_posix() for f in image_input.files]
    assert names == ["a.png", "b/c/x.PNG", "b/c/y.webp", "b/z.png", "lossy.jpg"]
    assert clients is None
    decoded = rows(image_input)
    for name, image in zip(names[:-1], decoded[:-1]):
        np.testing.assert_array_equal(image, written[name])
    assert decoded[-1].shape == (4, 4, 3)


def test_mixed_sizes_come_in_batches_of_one_size(tmp_path):
    sizes = [(6, 5), (8, 8), (6, 5), (3, 9), (8, 8)]
    written = [write(tmp_path / f"{i}.png", size=s) for i, s in enumerate(sizes)]
    image_input, _ = open_images(tmp_path)
    batches = list(image_input.batches(4, 1))
    assert [len(index) for index, _ in batches] == [2, 1, 1, 1]  # 4 files: 3 sizes; then 1
    for image, want in zip(rows(image_input, batch_size=4), written):
        np.testing.assert_array_equal(image, want)


def test_worker_processes_decode_the_same_rows(tmp_path):
    for i in range(7):
        write(tmp_path / f"{i}.png", size=(5 + i % 2, 5))
    image_input, _ = open_images(tmp_path)
    one, two = (
        rows(image_input, batch_size=2, workers=1),
        rows(image_input, batch_size=2, workers=2),
    )
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


def test_client_subfolders(tmp_path):
    for client, n in (("north", 2), ("south", 3)):
        for i in range(n):
            write(tmp_path / client / f"{i}.png")
    image_input, clients = open_images(tmp_path, clients_from_subfolders=True)
    assert clients.tolist() == ["north"] * 2 + ["south"] * 3
    assert len(image_input) == 5
    write(tmp_path / "stray.png")
    with pytest.raises(
        ValueError, match="stray.png is not inside a subfolder of .*, so it has no client"
    ):
        open_images(tmp_path, clients_from_subfolders=True)


def test_manifest_keeps_its_order_and_resolves_relative_paths(tmp_path):
    write(tmp_path / "img/a.png")
    write(tmp_path / "img/b.png")
    absolute = tmp_path / "elsewhere/c.png"
    write(absolute)
    manifest = tmp_path / "list.csv"
    manifest.write_text(f"path,client\nimg/b.png,x\n{absolute},y\nimg/a.png,x\n")
    image_input, clients = open_images(manifest)
    assert image_input.files == (tmp_path / "img/b.png", absolute, tmp_path / "img/a.png")
    assert clients.tolist() == ["x", "y", "x"]
    manifest.write_text("path\nimg/a.png\n")
    assert open_images(manifest)[1] is None


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "path,client\nimg/a.png,x\nimg/gone.png,y\n",
            r"list.csv line 3: image .*gone.png does not exist",
        ),
        ("file,client\nimg/a.png,x\n", "needs a 'path' column"),
        ("path,client\n", "lists no images"),
        ("path,client\nimg/a.png,\n", "line 2: empty 'client'"),
    ],
)
def test_manifest_errors_name_the_line(tmp_path, text, message):
    write(tmp_path / "img/a.png")
    (tmp_path / "list.csv").write_text(text)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        open_images(tmp_path / "list.csv")


def test_input_kinds(tmp_path):
    np.savez(tmp_path / "f.npz", features=np.zeros((2, 3)))
    np.savez(tmp_path / "i.npz", images=np.zeros((2, 4, 4, 1), np.uint8))
    np.savez(tmp_path / "adm.npz", arr_0=np.zeros((2, 4, 4, 3), np.uint8))
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    (tmp_path / "m.csv").write_text("path\n")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    assert [input_kind(tmp_path / n) for n in ("f.npz", "i.npz", "adm.npz", "m.csv")] == [
        "features",
        "images",
        "images",
        "manifest",
    ]
    assert input_kind(tmp_path) == "folder"
    with pytest.raises(ValueError, match="other.npz: an npz needs"):
        input_kind(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="junk.npz: expected an image folder"):
        input_kind(tmp_path / "junk.npz")
    with pytest.raises(FileNotFoundError, match="nothing.png: no such file"):
        input_kind(tmp_path / "nothing.png")


def test_image_npz_in_both_layouts(tmp_path):
    images = RNG.integers(0, 256, (5, 4, 4, 3), dtype=np.uint8)
    np.savez(tmp_path / "adm.npz", arr_0=images)
    np.savez(tmp_path / "own.npz", images=images)
    for name in ("adm.npz", "own.npz"):
        archive, clients = open_images(tmp_path / name)
        assert isinstance(archive, ImageArchive) and clients is None
        np.testing.assert_array_equal(np.stack(rows(archive, batch_size=2)), images)
        assert archive.describe()["input_shape"] == [5, 4, 4, 3]


def test_digest_follows_content_and_order_not_names(tmp_path):
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    write(a, seed=1)
    write(b, seed=2)
    digest = ImageFiles((a, b), tmp_path).describe()["input_sha256"]
    assert ImageFiles((b, a), tmp_path).describe()["input_sha256"] != digest
    renamed = tmp_path / "renamed.png"
    a.rename(renamed)
    assert ImageFiles((renamed, b), tmp_path).describe()["input_sha256"] == digest
    write(b, seed=3)
    assert ImageFiles((renamed, b), tmp_path).describe()["input_sha256"] != digest


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_undecodable_image_names_the_file(tmp_path, damage):
    write(tmp_path / "good.png")
    write(tmp_path / "bad.png", size=(40, 40))
    data = (tmp_path / "bad.png").read_bytes()
    (tmp_path / "bad.png").write_bytes(
        {"truncated": data[: len(data) // 2], "garbage": b"hello" * 20, "empty": b""}[damage]
    )
    image_input, _ = open_images(tmp_path)
    with pytest.raises(ValueError, match=r"cannot decode image .*bad.png"):
        rows(image_input)


def test_empty_folder_is_an_error_naming_it(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"empty: no .png/.jpg/.jpeg/.webp images"):
        open_images(tmp_path / "empty")
