"""Rehearse the full-scale studies offline, with the real upstream code (issue 37).

    .venv/bin/python bench/rehearse.py --upstream /path/to/trees [--out /tmp/rehearsal]
        [--configs cifar10 ffhq afhq imagenet256] [--stage generation|dag|all]
        [--device cpu|cuda] [--until TARGET]

``--upstream`` holds the public source trees at the pinned commits, as GitHub's
archives unpack (``stylegan2-ada-pytorch-<commit>/``, ``edm-<commit>/``; e.g.
``git archive --prefix=edm-<commit>/ <commit> | tar x``). This repository holds no
upstream code; the trees are used read-only.

Stage ``generation``: tiny networks with random weights are built with upstream's
own classes (``dnnlib.util.construct_class_by_name`` of ``training.networks``) and
pickled as upstream's training loops write their snapshots (StyleGAN2-ADA:
``training_set_kwargs, G, D, G_ema, augment_pipe``, each a deep copy in eval mode
on the CPU; EDM: ``ema, loss_fn, augment_pipe, dataset_kwargs``). Then
:func:`distrank.zoo.checkpoints.generate_from_checkpoint` at batch sizes 1, 3 and
8 is compared with upstream's own sampling code: StyleGAN2-ADA's ``generate.py``
command itself (run in-process, its hard-coded CUDA device mapped to ``--device``,
PNGs read back) and EDM's ``generate.py`` sampler (``StackedRandomGenerator`` and
``edm_sampler``, as its ``main`` calls them). Rule: bit-identical, both.

Stage ``dag``: format-faithful toy archives (CIFAR-10 python tarball, AFHQ zip of
JPEGs, ADM npz batches, FFHQ's folder layout), the code archives (``git archive``
layout: pax header with the commit) and the pickles are served on 127.0.0.1
under the real URLs' paths; each config of ``configs/`` is rewritten to toy size
(URLs to the mirror, checksums to the lock file, SIZE numbers, CPU resources,
DINOv2 replaced by the offline Inception-v3: DINOv2's weights are not offline)
and run with the real ``snakemake`` through every experiment it lists.

Stage ``gpu`` (on a machine with CUDA, nvcc and ``ninja``): the generation stage on
CUDA (plugins built and loaded through the patched ``get_plugin``, fp16 blocks), then
images per second of a 256 px network of upstream's FFHQ width with the plugins and
with upstream's reference ops.

Writes ``<out>/rehearsal.json`` (commits, timings, results).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import http.server
import io
import json
import pickle
import shutil
import struct
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # rehearse_generation

from rehearse_generation import (  # noqa: E402, F401 -- the generation stage (tests use them here)
    compare_generation,
    edm_pickle,
    gpu_speed,
    stylegan_pickle,
    upstream_edm,
    upstream_stylegan,
)

from distrank.zoo.upstream import EDM, PLUGINS, STYLEGAN2_ADA  # noqa: E402

CONFIGS = ("cifar10", "ffhq", "afhq", "imagenet256")


def trees(upstream: Path) -> dict[str, Path]:
    """The pinned source trees below ``upstream`` (KeyError naming what is missing)."""
    found = {}
    for key, pinned in (("stylegan2_ada", STYLEGAN2_ADA), ("edm", EDM)):
        tree = upstream / pinned.top_folder
        if not (tree / "dnnlib").is_dir():
            raise KeyError(f"{tree}: no source tree of {pinned.repo} at {pinned.commit}")
        found[key] = tree
    return found


# ---------------------------------------------------------------------------
# Real-format pickles, built with upstream's classes, saved as its training loops do


# ---------------------------------------------------------------------------
# Format-faithful toy data, served on 127.0.0.1 under the real URLs' paths


def _py2_pickle(obj) -> bytes:
    """Protocol 2 with Python 2 byte strings, as the CIFAR-10 batch files are."""

    class Py2Pickler(pickle._Pickler):
        dispatch = dict(pickle._Pickler.dispatch)

        def save_string(self, value):
            data = value.encode("latin1") if isinstance(value, str) else value
            if len(data) < 256:
                self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
            else:
                self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
            self.memoize(value)

        dispatch[str] = dispatch[bytes] = save_string

    buffer = io.BytesIO()
    Py2Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue().replace(b"numpy._core.multiarray", b"numpy.core.multiarray")


def _images(rng, n, size, n_classes=10):
    """Class-dependent toy pictures: a colour per class plus noise."""
    labels = np.arange(n) % n_classes
    base = (np.arange(n_classes)[:, None] * np.array([[97, 53, 29]]) % 256).astype(np.int64)
    images = base[labels][:, None, None, :] + rng.integers(-40, 40, (n, size, size, 3))
    return np.clip(images, 0, 255).astype(np.uint8), labels


def cifar10_tarball(rng, per_batch: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
        members = {}
        for name in names:
            images, labels = _images(rng, per_batch, 32)
            data = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
            members[name] = _py2_pickle(
                {
                    b"batch_label": name.encode(),
                    b"labels": labels.tolist(),
                    b"data": data,
                    b"filenames": [f"{i}.png".encode() for i in range(len(images))],
                }
            )
        classes = [
            "airplane",
            "automobile",
            "bird",
            "cat",
            "deer",
            "dog",
            "frog",
            "horse",
            "ship",
            "truck",
        ]
        members["batches.meta"] = _py2_pickle(
            {
                b"label_names": [c.encode() for c in classes],
                b"num_cases_per_batch": per_batch,
                b"num_vis": 3072,
            }
        )
        for name, payload in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def afhq_zip(rng, per_class: int, size: int = 64) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for split, n in (("train", per_class), ("val", per_class // 2)):
            for c, species in enumerate(("cat", "dog", "wild")):
                images, _ = _images(rng, n, size, n_classes=1)
                for i, image in enumerate(images):
                    jpeg = io.BytesIO()
                    Image.fromarray(
                        np.clip(image.astype(int) + 60 * c, 0, 255).astype(np.uint8)
                    ).save(jpeg, "JPEG", quality=90)
                    archive.writestr(
                        f"afhq/{split}/{species}/flickr_{species}_{i:06d}.jpg", jpeg.getvalue()
                    )
    return buffer.getvalue()


def adm_npz(rng, n: int, *, labels: bool, size: int = 32) -> bytes:
    images, classes = _images(rng, n, size, n_classes=10)
    buffer = io.BytesIO()
    arrays = {"arr_0": images} | ({"arr_1": classes.astype(np.int64)} if labels else {})
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def ffhq_folder(rng, root: Path, per_folder: int, folders: int) -> None:
    """thumbnails128x128/<00000 ...>/<index>.png and the held-out 69000/."""
    from PIL import Image

    for folder in [f"{1000 * k:05d}" for k in range(folders)] + ["69000"]:
        images, _ = _images(rng, per_folder, 128, n_classes=4)
        (root / folder).mkdir(parents=True, exist_ok=True)
        for j, image in enumerate(images):
            Image.fromarray(image).save(root / folder / f"{int(folder) + j:05d}.png")


def code_archive(tree: Path, commit: str) -> bytes:
    """A tar.gz as ``git archive`` (GitHub) writes it: pax global header with the commit."""
    buffer = io.BytesIO()
    with tarfile.open(
        fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT, pax_headers={"comment": commit}
    ) as tar:
        tar.add(tree, arcname=tree.name, filter=lambda i: None if "__pycache__" in i.name else i)
    return buffer.getvalue()


@contextlib.contextmanager
def serve(root: Path):
    """An http server on 127.0.0.1 serving ``root``; yields its base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def _mirror_path(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.netloc}{parts.path}"


def build_mirror(trees_: dict, mirror: Path, workdir: Path, config: dict, name: str, rng) -> None:
    """Every download of ``config`` as a toy file at its URL's path below ``mirror``."""
    for artifact, entry in config.get("downloads", {}).items():
        path = mirror / _mirror_path(entry["url"])
        path.parent.mkdir(parents=True, exist_ok=True)
        url = entry["url"]
        if "/archive/" in url:
            key = "stylegan2_ada" if "stylegan2" in url else "edm"
            pinned = STYLEGAN2_ADA if key == "stylegan2_ada" else EDM
            path.write_bytes(code_archive(trees_[key], pinned.commit))
        elif url.endswith(".pkl"):
            conditional = "cifar10" in url
            if "stylegan2" in url:
                stylegan_pickle(
                    trees_["stylegan2_ada"], path, resolution=32, c_dim=10 * conditional
                )
            else:
                # at the toy studies' 32 px, as every set of a study shares one size
                edm_pickle(trees_["edm"], path, resolution=32, label_dim=10 * conditional)
        elif artifact == "cifar10":
            path.write_bytes(cifar10_tarball(rng, per_batch=60))
        elif artifact == "afhq":
            path.write_bytes(afhq_zip(rng, per_class=16))
        elif url.endswith(".npz"):
            path.write_bytes(adm_npz(rng, 200, labels="labeled" in url))
        else:
            raise ValueError(f"no toy file for {artifact} ({url})")
    if name == "ffhq":
        ffhq_folder(rng, workdir / "resources/ffhq/thumbnails128x128", per_folder=20, folders=3)


# ---------------------------------------------------------------------------
# Toy configs and the DAG


def toy_config(config: dict, name: str, base_url: str) -> dict:
    """The study at toy size, downloading from the mirror, on the CPU."""
    cfg = copy.deepcopy(config)
    for entry in cfg.get("downloads", {}).values():
        entry.update(
            url=f"{base_url}/{_mirror_path(entry['url'])}", sha256=None, md5=None, size=None
        )
    cfg.update(downloads_allow_http=True, trust_pickles=True, n_samples=24)
    cfg["features"] = {
        "extractor": "inception",
        "backend": "torch",
        "batch_size": 32,
        "weights_dir": None,
    }
    cfg["generation"] = {"batch_size": 8}
    for key in ("reference", "heldout"):
        if key in cfg:
            _toy_real(cfg[key], key, name)
    for model in cfg["models"].values():
        if "resolution" in model:
            model["resolution"] = 32
    for partition in cfg["partitions"].values():
        if "n_clients" in partition:
            partition["n_clients"] = min(partition["n_clients"], 3)
    _toy_experiments(cfg)
    for resources in cfg["resources"].values():
        resources.update(gpus=0, threads=min(resources.get("threads", 1), 2))
    return cfg


def _toy_real(spec: dict, key: str, name: str) -> None:
    if "per_class" in spec:  # the toy AFHQ has 16 train and 8 val images a class
        spec["per_class"] = 12 if key == "reference" else 6
    else:
        # imagenet256: ~15 rows a class of the 10 toy classes, for E2's one-class clients
        spec["n"] = {"reference": 150 if name == "imagenet256" else 40, "heldout": 20}[key]
    source = spec["source"]
    if name == "ffhq":
        source["expect_images"] = 60 if key == "reference" else 20
    if isinstance(source.get("resolution"), int):
        source["resolution"] = 32


def _toy_experiments(cfg: dict) -> None:
    experiments = cfg["experiments"]
    if "E4" in experiments:
        for family in experiments["E4"]["families"].values():
            family["values"] = family["values"][::4]
            if "resolution" in family:
                family["resolution"] = 32
    if "E8" in experiments:
        experiments["E8"].update(n_clients=3, alphas=[1000, 0.1], seeds=1, block_rows=4, min_rows=6)
    if "E5" in experiments:
        experiments["E5"].update(rounds=2, local_steps=2, batch_size=16, n_samples=24)
    if "E7" in experiments:
        experiments["E7"].update(steps=4, eval_every=2, local_steps=1, batch_size=16, n_samples=24)
    if "zoo" in cfg and "cgan" in cfg["zoo"]:
        cfg["zoo"]["cgan"]["steps"] = 20


def run_dag(
    name: str, trees_: dict, out: Path, *, cores: int, until: str | None, dry_run: bool = False
) -> dict:
    workdir, mirror = out / "dag" / name, out / "mirror" / name
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    config = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    build_mirror(trees_, mirror, workdir, config, name, rng)
    with serve(mirror) as base_url:
        toy = toy_config(config, name, base_url)
        (workdir / "toy.yaml").write_text(yaml.safe_dump(toy, sort_keys=False))
        command = [
            str(REPO / ".venv/bin/snakemake"),
            "-s",
            str(REPO / "Snakefile"),
            "-d",
            str(workdir),
            "--configfile",
            str(workdir / "toy.yaml"),
            "--cores",
            str(cores),
            "--keep-going",
        ]
        if until:
            command += ["--until", until]
        if dry_run:
            command.append("-n")
        log = workdir / "snakemake.log"
        with open(log, "w") as handle:
            rc = subprocess.run(
                command, stdout=handle, stderr=subprocess.STDOUT, cwd=workdir
            ).returncode
    figures = (
        sorted(str(p.relative_to(workdir)) for p in (workdir / "figures").rglob("*") if p.is_file())
        if (workdir / "figures").is_dir()
        else []
    )
    lock = (
        json.loads((workdir / "resources/checksums.lock").read_text())
        if (workdir / "resources/checksums.lock").exists()
        else {}
    )
    return {
        "returncode": rc,
        "seconds": round(time.perf_counter() - t0, 1),
        "figures": figures,
        "code_archives": {
            u.rsplit("/", 1)[-1]: {k: e.get(k) for k in ("commit", "tree")}
            for u, e in lock.items()
            if "/archive/" in u
        },
        "log": str(log),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("/tmp/distrank-rehearsal"))
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--stage", choices=("generation", "dag", "all", "gpu"), default="all")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--until", default=None, help="snakemake --until (e.g. a figure rule)")
    parser.add_argument("--dry-run", action="store_true", help="snakemake -n: the DAG only")
    args = parser.parse_args(argv)
    trees_ = trees(args.upstream.resolve())
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    report = {
        "upstreams": {k: str(v.name) for k, v in trees_.items()},
        "torch": torch.__version__,
        "device": args.device,
    }
    t0 = time.perf_counter()
    if args.stage == "gpu":  # bench/rehearse.py --stage gpu --device cuda: one GPU script
        report["generation"] = compare_generation(trees_, args.out, device="cuda")
        report["gpu_speed"] = gpu_speed(trees_, args.out)
        print(json.dumps(report["gpu_speed"]), flush=True)
    if args.stage in ("generation", "all"):
        report["generation"] = compare_generation(trees_, args.out, device=args.device)
        report["cuda_plugins_loaded"] = sorted(PLUGINS)
    if args.stage in ("dag", "all"):
        report["dag"] = {}
        for name in args.configs:
            report["dag"][name] = run_dag(
                name, trees_, args.out, cores=args.cores, until=args.until, dry_run=args.dry_run
            )
            print(name, json.dumps(report["dag"][name]), flush=True)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    (args.out / "rehearsal.json").write_text(json.dumps(report, indent=2) + "\n")
    ok = all(
        row[f"batch{b}"]["bit_identical"]
        for row in report.get("generation", {}).values()
        for b in (1, 3, 8)
    ) and all(d["returncode"] == 0 for d in report.get("dag", {}).values())
    if args.stage == "gpu":  # the fast ops ran: both plugins built and loaded
        ok = ok and {"bias_act_plugin", "upfirdn2d_plugin"} <= set(PLUGINS)
    print(
        "rehearsal",
        "passed" if ok else "FAILED",
        f"in {report['seconds']} s; {args.out / 'rehearsal.json'}",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
