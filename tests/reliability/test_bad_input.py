"""Bad input rows of the reliability matrix (README.md here) that no other test covers:
each ends in an error naming the file, key or value, and leaves no output behind."""

from __future__ import annotations

import ast
import copy
import inspect
import re
import socket
import threading
import traceback
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from textkit import cli_error

import distrank.experiments as experiments
from distrank import config as config_module
from distrank.cli import EXIT_INPUT, main
from distrank.config import check, check_file
from distrank.data.download import fetch
from distrank.data.transfer import DownloadError
from distrank.features.cache import load_features
from distrank.metrics._score_files import score_client_file

REPO = Path(__file__).resolve().parents[2]
TINY = yaml.safe_load((REPO / "tests/e2e/tiny.yaml").read_text())
RNG = np.random.default_rng(3)


# --- images of a mode the decoders would clip -----------------------------------------------


def sixteen_bit_png(path: Path) -> Path:
    """A 16-bit grayscale PNG (PIL mode I;16): values up to 60000, which convert("L")
    would clip to 255 instead of scaling."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.arange(64, dtype=np.uint16).reshape(8, 8) * 950).save(path)
    assert Image.open(path).mode == "I;16"
    return path


def read_with_folders(folder: Path):
    from distrank.data.folders import open_images

    images, _ = open_images(folder)
    return list(images.batches(4))


def read_with_readers(folder: Path):
    from distrank.data.readers import read_image_folder

    return read_image_folder(folder)


def read_with_sources(folder: Path):
    from distrank.data.sources import load_source

    return load_source({"kind": "folder", "path": str(folder)})


@pytest.mark.parametrize(
    "reader",
    [read_with_folders, read_with_readers, read_with_sources],
    ids=["cli-folder", "read_image_folder", "config-folder-source"],
)
def test_a_16_bit_image_is_refused_naming_file_and_mode(tmp_path, reader):
    (tmp_path / "imgs").mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / "imgs/a.png")  # 8-bit: fine
    bad = sixteen_bit_png(tmp_path / "imgs/b.png")
    with pytest.raises(ValueError) as err:
        reader(tmp_path / "imgs")
    said = re.search(
        rf"(^|: ){re.escape(str(bad))}: a (\S+) image \(more than 8 bits a channel\), which "
        "would be clipped at 255; save it with 8 bits a channel$",
        str(err.value),
    )
    assert said and said[2].startswith("I;16"), str(err.value)


# --- feature npz: missing key, NaN/inf, object arrays, a single array -------------------------

METRICS = {"kernel": "poly", "kd_estimator": "unbiased", "pr_k": 3, "dc_k": 5, "dtype": "float64"}


def feature_file(path: Path, kind: str) -> Path:
    x = RNG.normal(size=(30, 4)).astype(np.float32)
    if kind == "no key":
        np.savez(path, feats=x)
    elif kind == "object array":
        np.savez(path, features=np.array([x[0], "x"], dtype=object))
    elif kind in ("nan", "inf"):
        x[7, 2] = np.nan if kind == "nan" else np.inf
        np.savez(path, features=x)
    elif kind == "single array":
        with open(path, "wb") as handle:
            np.save(handle, x)
    return path


PIPELINE_ERRORS = {
    "no key": r"m\.npz: no 'features' array \(has \['feats'\]\)",
    "object array": r"m\.npz: cannot read 'features' without pickle",
    "single array": r"m\.npz: expected an npz archive",
    "nan": r"m\.npz: 'features' has NaN or infinite values in 1 rows",
    "inf": r"m\.npz: 'features' has NaN or infinite values in 1 rows",
}


@pytest.mark.parametrize("kind", sorted(PIPELINE_ERRORS))
def test_a_bad_model_feature_file_stops_a_client_job_and_writes_nothing(tmp_path, kind):
    client = tmp_path / "c0.npz"
    np.savez(client, features=RNG.normal(size=(40, 4)).astype(np.float32))
    model = feature_file(tmp_path / "m.npz", kind)
    out = tmp_path / "scores" / "c0.json"
    with pytest.raises(ValueError, match=PIPELINE_ERRORS[kind]):
        score_client_file(client, {"m": model}, out, client="c0", options=METRICS)
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_an_object_array_is_never_unpickled(tmp_path):
    path = feature_file(tmp_path / "m.npz", "object array")
    with pytest.raises(ValueError, match="without pickle"):
        load_features(path)


@pytest.mark.parametrize(
    "kind,message",
    [
        ("object array", "cannot read 'features' without pickle"),
        ("inf", "'features' has NaN or infinite values in 1 rows"),
    ],
    ids=["object array", "inf"],
)
def test_a_bad_model_feature_file_is_exit_3_of_the_cli(tmp_path, capsys, kind, message):
    clients = np.repeat(["a", "b"], 20)
    np.savez(
        tmp_path / "ref.npz", features=RNG.normal(size=(40, 4)).astype(np.float32), clients=clients
    )
    model = feature_file(tmp_path / "m.npz", kind)
    out = tmp_path / "out" / "scores.csv"
    status = main(
        [
            "score",
            "--reference",
            str(tmp_path / "ref.npz"),
            "--model",
            f"m={model}",
            "--out",
            str(out),
            "-q",
        ]
    )
    said = cli_error(capsys.readouterr().err, "score")
    assert status == EXIT_INPUT and said.startswith(f"{model}: {message}"), said
    assert not out.parent.exists()


# --- downloads: connection refused, read timeout ----------------------------------------------


def test_connection_refused_names_the_url_and_leaves_no_file(tmp_path):
    with socket.socket() as probe:  # a port on 127.0.0.1 that nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/blob.bin"
    with pytest.raises(DownloadError) as err:
        fetch(
            url,
            tmp_path / "blob.bin",
            sha256="0" * 64,
            retries=1,
            backoff=0.0,
            timeout=5,
            allow_http=True,
        )
    assert "Connection refused" in last_error(str(err.value), url)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def silent_server():
    """A server on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.05)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(timeout=5)
    for conn in held:
        conn.close()
    server.close()


def last_error(message: str, url: str, attempts: int = 2) -> str:
    """The last error of a download that gave up (the message names the URL and the tries)."""
    said = re.fullmatch(
        rf"could not download {re.escape(url)} after {attempts} attempts; last error: (.*?)"
        r"( \(partial data kept in \S+ for resuming\))?",
        message,
    )
    assert said, message
    return said[1]


def test_read_timeout_names_the_url_and_leaves_no_file(tmp_path, silent_server):
    url = f"{silent_server}/blob.bin"
    with pytest.raises(DownloadError) as err:
        fetch(
            url,
            tmp_path / "blob.bin",
            sha256="0" * 64,
            retries=1,
            backoff=0.0,
            timeout=0.3,
            allow_http=True,
        )
    assert "timed out" in last_error(str(err.value), url)
    assert not (tmp_path / "blob.bin").exists()


# --- every cross-key config error of distrank.config ------------------------------------------
# Each case mutates the tiny config (keeping only the experiments it names) and must end in
# its check's ValueError; test_every_config_check_has_a_case proves that the cases reach
# every `raise` of the check functions.

DOWNLOAD = {"url": "https://example.org/x", "sha256": None, "md5": None, "size": None}
FOLDER = {"kind": "folder", "path": "imgs/"}


def _downloads(**extract):
    return {name: {**DOWNLOAD, "extract": flag} for name, flag in extract.items()}


def _no_cgan(c):
    c["zoo"].pop("cgan")
    c["models"] = {n: s for n, s in c["models"].items() if s["kind"] != "cgan"}


CASES = {
    "unregistered metric": (
        None,
        lambda c: c["metrics"].update(metrics=["kd", "kid"]),
        "metrics.metrics: 'kid' is not a registered metric",
    ),
    "unknown scoring option": (
        None,
        lambda c: c["metrics"].update(kernal="rbf"),
        "config: metrics: options: unknown scoring option(s) ['kernal']",
    ),
    "unknown plugin": (
        None,
        lambda c: c.update(plugins=["no_such_plugin_module"]),
        "plugins: cannot import 'no_such_plugin_module'",
    ),
    "unknown experiment": (
        None,
        lambda c: c["experiments"].update(E99={}),
        "experiments.E99 is not an experiment",
    ),
    "unknown partition": (
        "E1",
        lambda c: c["experiments"]["E1"].update(partition="dirichlett"),
        "experiments.E1.partition is 'dirichlett', not one of partitions",
    ),
    "reserved model name": (
        "E1",
        lambda c: c["models"].update({"e2-G1": {"kind": "heldout"}}),
        "models.e2-G1: names e<n>-... are the experiments' own",
    ),
    "family without zoo entry": (
        "E1",
        lambda c: c["zoo"].pop("vae"),
        "models.vae-t1 is a vae, but zoo.vae is not set",
    ),
    "heldout model without heldout": (
        "E1",
        lambda c: c.pop("heldout"),
        "models.real is a heldout model",
    ),
    "images model with max_images": (
        "E1",
        lambda c: c["models"].update(
            mine={"kind": "images", "source": {"kind": "npz", "path": "x.npz", "max_images": 5}}
        ),
        "models.mine.source.max_images",
    ),
    "artifact not downloaded": (
        "E1",
        lambda c: c["models"].update(
            sg={"kind": "checkpoint", "checkpoint": "sg_pkl", "code": "sg_code"}
        ),
        "models.sg.checkpoint is 'sg_pkl', not one of downloads",
    ),
    "artifact extract flag": (
        "E1",
        lambda c: (
            c.update(downloads=_downloads(b=True)),
            c["heldout"].update(source={"kind": "npz", "artifact": "b"}),
        ),
        "downloads.b.extract must be false",
    ),
    "unlabelled reference per class": (
        "E3",
        lambda c: c["reference"].update(source=FOLDER),
        "reference.per_class need(s) class labels",
    ),
    "labels declared on an unlabelled folder": (
        "E3",
        lambda c: c["reference"].update(source=FOLDER | {"labels": True}),
        "reference.source.labels is True, but reference.source is a folder without",
    ),
    "labels listing other keys than need them": (
        "E3",
        lambda c: c["reference"]["source"].update(labels=["experiments.E8"]),
        "reference.source.labels lists ['experiments.E8'], but the keys that need",
    ),
    "E2 base model": (
        "E2",
        lambda c: c["experiments"]["E2"].update(base_model="realz"),
        "experiments.E2.base_model 'realz' is not one of models",
    ),
    "E4 repeated knob values": (
        "E4",
        lambda c: c["experiments"]["E4"]["families"]["vae"].update(values=[1.0, 1.0]),
        "experiments.E4.families.vae.values: repeated knob values",
    ),
    "E4 family without zoo entry": (
        "E4",
        lambda c: (c["zoo"].pop("diffusion"), c["models"].pop("diffusion-g1")),
        "experiments.E4.families.diffusion.kind is 'diffusion', but zoo",
    ),
    "E4 simulated without heldout": (
        "E4",
        lambda c: (
            c.pop("heldout"),
            [c["models"].pop(m) for m in ("real", "noise-64", "blur-2", "drop-4")],
        ),
        "experiments.E4.families.simulated: the simulated family pulls held-out features",
    ),
    "E4 unknown kind": (
        "E4",
        lambda c: c["experiments"]["E4"]["families"]["vae"].update(kind="gan"),
        "experiments.E4.families.vae.kind: unknown 'gan'",
    ),
    "E5 unlabelled reference": (
        "E5",
        lambda c: (c["reference"].update(source=FOLDER, n=100), c["reference"].pop("per_class")),
        "experiments.E5 trains a class-conditional GAN",
    ),
    "E7 without the cGAN": ("E7", _no_cgan, "experiments.E7 fine-tunes the zoo's cGAN"),
    "E7 bandwidth without a bandwidth kernel": (
        "E7",
        lambda c: c["experiments"]["E7"].update(kernel="poly", bandwidth=1.0),
        "experiments.E7.bandwidth is set, but kernel 'poly' has none",
    ),
    "E7 steps": (
        "E7",
        lambda c: c["experiments"]["E7"].update(steps=5),
        "experiments.E7.steps (5) must be a multiple of eval_every (2)",
    ),
    "E7 eval_every": (
        "E7",
        lambda c: c["experiments"]["E7"].update(local_steps=3, steps=6, eval_every=2),
        "experiments.E7.eval_every (2) must be a multiple of local_steps (3)",
    ),
    "E8 unlabelled reference": (
        "E8",
        lambda c: (c["reference"].update(source=FOLDER, n=100), c["reference"].pop("per_class")),
        "experiments.E8 partitions the reference by class",
    ),
    "E8 min_rows": (
        "E8",
        lambda c: c["experiments"]["E8"].update(min_rows=5),
        "experiments.E8.min_rows is 5, but PRDC's k-NN radii",
    ),
    "E9 bandwidth_from": (
        "E9",
        lambda c: c["experiments"]["E9"].update(bandwidth_from="rael"),
        "experiments.E9.bandwidth_from 'rael' is not a model",
    ),
    "E9 kd_estimator": (
        "E9",
        lambda c: c["metrics"].update(kd_estimator="subsets"),
        "experiments.E9 needs metrics.kd_estimator 'unbiased' or 'biased'",
    ),
    "E9 client_sizes": (
        "E9",
        lambda c: c["experiments"]["E9"].update(client_sizes=[8, 4]),
        "experiments.E9.client_sizes must increase, got [8, 4]",
    ),
    "E11 kd_estimator": (
        "E11",
        lambda c: c["metrics"].update(kd_estimator="biased"),
        "experiments.E11 needs metrics.kd_estimator 'unbiased'",
    ),
    "E11 dims": (
        "E11",
        lambda c: c["experiments"]["E11"].update(dims=[256, 64]),
        "experiments.E11.dims must increase, got [256, 64]",
    ),
    "metric an experiment reads not scored": (
        "E1",
        lambda c: c["metrics"].update(metrics=["fd"]),
        "metrics.metrics is ['fd'], but experiments.E1 reads ['kd', 'precision'",
    ),
    "E10 kd_estimator": (
        "E10",
        lambda c: c["metrics"].update(kd_estimator="subsets"),
        "experiments.E10 bootstraps KD: metrics.kd_estimator: expected 'unbiased' or 'biased'",
    ),
}


def broken_config(name: str) -> dict:
    keep, mutate, _ = CASES[name]
    cfg = copy.deepcopy(TINY)
    cfg["experiments"] = {k: v for k, v in cfg["experiments"].items() if k == keep}
    mutate(cfg)
    return cfg


def test_the_base_of_every_case_passes():
    for keep in {keep for keep, _, _ in CASES.values()} - {None}:
        cfg = copy.deepcopy(TINY)
        cfg["experiments"] = {keep: cfg["experiments"][keep]}
        assert check(cfg) == [], keep


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_cross_key_config_error_names_the_key(name):
    with pytest.raises(ValueError) as err:
        check(broken_config(name))
    assert str(err.value).startswith("config: ") and CASES[name][2] in str(err.value)


def check_raise_sites() -> set[tuple[str, int]]:
    """(file, line) of every `raise` inside the config check functions: distrank.config's,
    each experiment module's check(), and the registry's get (an unknown key) and key checks."""
    sites = set()
    files = {
        Path(config_module.__file__): None,
        Path(experiments.__file__): {"get", "check_partition", "check_model"},
    }
    files |= {  # where check is defined: a package experiment's __init__ imports it
        Path(inspect.getsourcefile(e.module.check)): {"check"}
        for e in experiments.EXPERIMENTS.values()
        if hasattr(e.module, "check")
    }
    for path, names in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and (names is None or node.name in names):
                sites |= {(str(path), r.lineno) for r in ast.walk(node) if isinstance(r, ast.Raise)}
    return sites


def raise_site(err: BaseException) -> tuple[str, int]:
    frame = traceback.extract_tb(err.__traceback__)[-1]
    return frame.filename, frame.lineno


def test_every_config_check_has_a_case(tmp_path):
    reached = set()
    for name in CASES:
        with pytest.raises(ValueError) as err:
            check(broken_config(name))
        reached.add(raise_site(err.value))
    (tmp_path / "dup.yaml").write_text("models:\n  real: {kind: heldout}\n  real: {kind: noise}\n")
    with pytest.raises(ValueError) as err:
        check_file(tmp_path / "dup.yaml")
    reached.add(raise_site(err.value))
    missing = check_raise_sites() - reached
    assert not missing, f"config checks without a case in CASES: {sorted(missing)}"


# --- duplicated model names -------------------------------------------------------------------


def test_a_model_name_given_twice_in_a_config_file_is_named_with_its_lines(tmp_path):
    text = (REPO / "tests/e2e/tiny.yaml").read_text()
    assert "  noise-64: {kind: noise, sigma: 64.0}" in text.splitlines()
    path = tmp_path / "study.yaml"
    path.write_text(
        text.replace(
            "  noise-64: {kind: noise, sigma: 64.0}\n",
            "  noise-64: {kind: noise, sigma: 64.0}\n  cgan-t1: {kind: cgan, truncation: 2.0}\n",
        )
    )
    line = text.splitlines().index("  cgan-t1: {kind: cgan, truncation: 1.0}") + 1
    with pytest.raises(
        ValueError,
        match=rf"config: {path} line \d+: models\.cgan-t1 is given "
        rf"twice \(first on line {line}\)",
    ):
        check_file(path)
    check_file(REPO / "tests/e2e/tiny.yaml")  # the shipped configs repeat no key
    for shipped in [REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml"))]:
        check_file(shipped)


def test_nested_and_listed_keys_are_checked(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("experiments:\n  E4:\n    families:\n      - {kind: a, kind: b}\n")
    with pytest.raises(ValueError, match=r"line 4: experiments\.E4\.families\[0\]\.kind is given"):
        check_file(path)


def test_a_model_name_given_twice_to_the_cli_is_a_usage_error(tmp_path, capsys):
    np.savez(
        tmp_path / "ref.npz",
        features=RNG.normal(size=(40, 4)).astype(np.float32),
        clients=np.repeat(["a", "b"], 20),
    )
    np.savez(tmp_path / "m.npz", features=RNG.normal(size=(30, 4)).astype(np.float32))
    out = tmp_path / "out" / "s.csv"
    status = main(
        [
            "score",
            "--reference",
            str(tmp_path / "ref.npz"),
            "--model",
            f"A={tmp_path / 'm.npz'}",
            "--model",
            f"A={tmp_path / 'm.npz'}",
            "--out",
            str(out),
            "-q",
        ]
    )
    assert status == EXIT_INPUT
    assert "--model: model name 'A' given twice" in capsys.readouterr().err
    assert not out.parent.exists()


# --- a model with fewer images than n_samples -------------------------------------------------


def test_an_images_model_with_fewer_images_than_n_samples_is_named(tmp_path):
    from distrank.data.images import save_images
    from distrank.zoo import make_images

    save_images(tmp_path / "mine.npz", RNG.integers(0, 256, (30, 8, 8, 1), dtype=np.uint8))
    spec = {"kind": "images", "source": {"kind": "npz", "path": str(tmp_path / "mine.npz")}}
    with pytest.raises(
        ValueError, match="models.mine: its source has 30 images, fewer than n_samples=50"
    ):
        make_images(spec, 50, seed=0, inputs={}, name="mine")
    images, _ = make_images(spec, 30, seed=0, inputs={}, name="mine")
    assert images.shape == (30, 8, 8, 1)


# --- weights of the wrong network -------------------------------------------------------------


def test_weights_of_another_shape_name_the_file(tmp_path):
    import torch

    from distrank.features.inception import InceptionExtractor

    path = tmp_path / "pt_inception-2015-12-05-6726825d.pth"
    torch.save({"Conv2d_1a_3x3.conv.weight": torch.zeros(3, 3)}, path)
    with pytest.raises(
        ValueError,
        match=rf"{path} does not hold the weights of the FID "
        "Inception-v3: .*Missing key",
    ):
        InceptionExtractor(weights_path=path, device="cpu")
