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

from distrank.zoo.checkpoints import generate_from_checkpoint  # noqa: E402
from distrank.zoo.upstream import EDM, PLUGINS, STYLEGAN2_ADA, upstream_code  # noqa: E402

CONFIGS = ("cifar10", "ffhq", "afhq", "imagenet256")
SEEDS = 8  # images compared per network


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


def stylegan_pickle(
    tree: Path, out: Path, *, resolution: int, c_dim: int, seed: int = 0, channels=(256, 32)
) -> Path:
    """A StyleGAN2-ADA snapshot (num_fp16_res=4, conv_clamp=256: upstream's defaults)."""
    import torch

    with upstream_code(tree), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        import dnnlib

        common = dict(c_dim=c_dim, img_resolution=resolution, img_channels=3)
        G_kwargs = dnnlib.EasyDict(
            class_name="training.networks.Generator",
            z_dim=32,
            w_dim=32,
            mapping_kwargs=dnnlib.EasyDict(num_layers=2),
            synthesis_kwargs=dnnlib.EasyDict(
                channel_base=channels[0], channel_max=channels[1], num_fp16_res=4, conv_clamp=256
            ),
        )
        D_kwargs = dnnlib.EasyDict(
            class_name="training.networks.Discriminator",
            block_kwargs=dnnlib.EasyDict(),
            mapping_kwargs=dnnlib.EasyDict(),
            epilogue_kwargs=dnnlib.EasyDict(mbstd_group_size=4),
            channel_base=256,
            channel_max=32,
            num_fp16_res=4,
            conv_clamp=256,
        )
        G = dnnlib.util.construct_class_by_name(**G_kwargs, **common).train().requires_grad_(False)
        D = dnnlib.util.construct_class_by_name(**D_kwargs, **common).train().requires_grad_(False)
        G_ema = copy.deepcopy(G).eval()
        # training/training_loop.py's snapshot: the kwargs, then each module deep-copied.
        snapshot = dict(training_set_kwargs=dict(path="toy.zip", use_labels=c_dim > 0))
        for name, module in (("G", G), ("D", D), ("G_ema", G_ema), ("augment_pipe", None)):
            if module is not None:
                module = copy.deepcopy(module).eval().requires_grad_(False).cpu()
            snapshot[name] = module
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "wb") as handle:
            pickle.dump(snapshot, handle)
    return out


def edm_pickle(tree: Path, out: Path, *, resolution: int, label_dim: int, seed: int = 0) -> Path:
    """An EDM snapshot: EDMPrecond over a tiny SongUNet (DDPM++ layout), random weights."""
    import torch

    with upstream_code(tree), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        import dnnlib

        network_kwargs = dnnlib.EasyDict(
            class_name="training.networks.EDMPrecond",
            model_type="SongUNet",
            embedding_type="positional",
            encoder_type="standard",
            decoder_type="standard",
            channel_mult_noise=1,
            resample_filter=[1, 1],
            model_channels=16,
            channel_mult=[1, 2],
            num_blocks=1,
            attn_resolutions=[resolution // 2],
            dropout=0.0,
            use_fp16=False,
        )
        interface = dict(img_resolution=resolution, img_channels=3, label_dim=label_dim)
        net = dnnlib.util.construct_class_by_name(**network_kwargs, **interface)
        with torch.no_grad():  # random weights everywhere (upstream zero-inits some layers)
            for p in net.parameters():
                p.add_(0.05 * torch.randn_like(p))
        loss_fn = dnnlib.util.construct_class_by_name(class_name="training.loss.EDMLoss")
        ema = copy.deepcopy(net).eval().requires_grad_(False)
        # training/training_loop.py's snapshot: modules deep-copied, eval, on the CPU.
        data = dict(ema=ema, loss_fn=loss_fn, augment_pipe=None, dataset_kwargs=dict(path="toy"))
        for key, value in data.items():
            if isinstance(value, torch.nn.Module):
                data[key] = copy.deepcopy(value).eval().requires_grad_(False).cpu()
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "wb") as handle:
            pickle.dump(data, handle)
    return out


# ---------------------------------------------------------------------------
# Upstream's own sampling code


class _TorchOn:
    """``torch`` for upstream's generate.py, its hard-coded ``torch.device('cuda')`` mapped."""

    def __init__(self, device: str):
        import torch

        self._torch, self._device = torch, device

    def device(self, *args, **kwargs):
        return self._torch.device(self._device)

    def __getattr__(self, name):
        return getattr(self._torch, name)


def upstream_stylegan(tree, pkl, seeds, *, psi, class_idx, device, outdir: Path) -> np.ndarray:
    """Run StyleGAN2-ADA's generate.py command in-process; its PNGs as an array."""
    from PIL import Image

    with upstream_code(tree):
        import generate

        generate.torch = _TorchOn(device)
        args = [f"--network={pkl}", f"--seeds={','.join(map(str, seeds))}", f"--trunc={psi}"]
        args += ["--noise-mode=const", f"--outdir={outdir}"]
        if class_idx is not None:
            args.append(f"--class={class_idx}")
        generate.generate_images.main(args, standalone_mode=False)
    return np.stack([np.asarray(Image.open(outdir / f"seed{s:04d}.png")) for s in seeds])


def upstream_edm(tree, pkl, seeds, *, class_idx, num_steps, device, max_batch_size=64):
    """EDM's generate.py main loop on one rank: StackedRandomGenerator + edm_sampler."""
    import torch

    with upstream_code(tree):
        import generate

        with open(pkl, "rb") as handle:
            net = pickle.load(handle)["ema"].to(device)
        out = []
        for start in range(0, len(seeds), max_batch_size):
            batch_seeds = seeds[start : start + max_batch_size]
            rnd = generate.StackedRandomGenerator(device, batch_seeds)
            shape = [len(batch_seeds), net.img_channels, net.img_resolution, net.img_resolution]
            latents = rnd.randn(shape, device=device)
            class_labels = None
            if net.label_dim:
                eye = torch.eye(net.label_dim, device=device)
                class_labels = eye[
                    rnd.randint(net.label_dim, size=[len(batch_seeds)], device=device)
                ]
            if class_idx is not None:
                class_labels[:, :] = 0
                class_labels[:, class_idx] = 1
            with torch.no_grad():
                images = generate.edm_sampler(
                    net, latents, class_labels, randn_like=rnd.randn_like, num_steps=num_steps
                )
            images = (images * 127.5 + 128).clip(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
            out.append(images.cpu().numpy())
    return np.concatenate(out)


def compare_generation(trees_: dict, out: Path, *, device: str) -> dict:
    """Both families, conditional and not: ours at batch 1, 3, 8 against upstream's code."""
    results = {}
    seeds = list(range(5, 5 + SEEDS))
    cases = [
        (
            "stylegan2_cifar10",
            "stylegan2_ada",
            dict(resolution=32, c_dim=10),
            dict(psi=0.7, class_idx=3),
        ),
        (
            "stylegan2_uncond",
            "stylegan2_ada",
            dict(resolution=32, c_dim=0),
            dict(psi=1.0, class_idx=None),
        ),
        ("edm_cifar10", "edm", dict(resolution=16, label_dim=10), dict(class_idx=3, num_steps=6)),
        ("edm_uncond", "edm", dict(resolution=16, label_dim=0), dict(class_idx=None, num_steps=6)),
    ]
    for name, family, build, knobs in cases:
        tree = trees_[family]
        t0 = time.perf_counter()
        if family == "stylegan2_ada":
            pkl = stylegan_pickle(tree, out / "pickles" / f"{name}.pkl", **build)
            theirs = upstream_stylegan(
                tree, pkl, seeds, device=device, outdir=out / "upstream" / name, **knobs
            )
            ours_kw = dict(truncation_psi=knobs["psi"], class_idx=knobs["class_idx"])
        else:
            pkl = edm_pickle(tree, out / "pickles" / f"{name}.pkl", **build)
            theirs = upstream_edm(tree, pkl, seeds, device=device, **knobs)
            ours_kw = knobs
        t_upstream = time.perf_counter() - t0
        row = {"upstream_s": round(t_upstream, 2), "images": len(seeds)}
        for batch in (1, 3, 8):
            t0 = time.perf_counter()
            ours, _ = generate_from_checkpoint(
                pkl,
                tree,
                n=len(seeds),
                seed=seeds[0],
                batch_size=batch,
                device=device,
                trust_pickles=True,
                **ours_kw,
            )
            differ = ours.astype(int) != theirs.astype(int)
            row[f"batch{batch}"] = {
                "bit_identical": bool(not differ.any()),
                "pixels_differing": float(differ.mean()),
                "max_abs": int(np.abs(ours.astype(int) - theirs).max()),
                "seconds": round(time.perf_counter() - t0, 2),
            }
        if family == "stylegan2_ada":
            row["one_batched_pass_of_8"] = _batched_pass(tree, pkl, seeds, theirs, **knobs)
        results[name] = row
        print(name, json.dumps(row), flush=True)
    return results


def _batched_pass(tree, pkl, seeds, theirs, *, psi, class_idx) -> dict:
    """What item 2 is about: all seeds in one forward pass of the fp16 network."""
    import torch

    with upstream_code(tree):
        import legacy

        with open(pkl, "rb") as handle:
            G = legacy.load_network_pkl(handle)["G_ema"]
        z = torch.from_numpy(
            np.concatenate([np.random.RandomState(s).randn(1, G.z_dim) for s in seeds])
        )
        c = torch.zeros([len(seeds), G.c_dim])
        if class_idx is not None:
            c[:, class_idx] = 1
        with torch.no_grad():
            img = G(z, c, truncation_psi=psi, noise_mode="const")
    batched = (img.permute(0, 2, 3, 1) * 127.5 + 128).clamp(0, 255).to(torch.uint8).numpy()
    differ = batched.astype(int) != theirs
    return {
        "pixels_differing": float(differ.mean()),
        "max_abs": int(np.abs(batched.astype(int) - theirs).max()),
    }


def gpu_speed(trees_: dict, out: Path, *, resolution: int = 256, n: int = 64) -> dict:
    """Images per second of generate.py's loop (batch 1) on CUDA with a StyleGAN2-ADA
    network of upstream's FFHQ width (channel_base 32768, max 512; fp16 in the top 4
    resolutions), with the CUDA plugins (patched get_plugin) and with upstream's
    reference ops; and of generate_from_checkpoint."""
    import torch

    tree = trees_["stylegan2_ada"]
    pkl = stylegan_pickle(
        tree, out / "pickles" / "speed.pkl", resolution=resolution, c_dim=0, channels=(32768, 512)
    )
    result = {"resolution": resolution, "images": n}
    for ops in ("plugins", "reference"):
        with upstream_code(tree):
            import legacy
            from torch_utils.ops import bias_act, upfirdn2d

            if ops == "reference":  # upstream's own switch: _init() False -> reference ops
                bias_act._init = upfirdn2d._init = lambda: False
            with open(pkl, "rb") as handle:
                G = legacy.load_network_pkl(handle)["G_ema"].to("cuda")
            label = torch.zeros([1, 0], device="cuda")
            with torch.no_grad():
                for _warm in range(3):  # builds and loads the plugins
                    G(torch.randn([1, G.z_dim], device="cuda"), label, noise_mode="const")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for seed in range(n):
                    z = torch.from_numpy(np.random.RandomState(seed).randn(1, G.z_dim)).cuda()
                    G(z, label, truncation_psi=1, noise_mode="const")
                torch.cuda.synchronize()
            result[f"{ops}_images_per_s"] = round(n / (time.perf_counter() - t0), 2)
            result[f"{ops}_uses_fp16"] = any(getattr(b, "use_fp16", False) for b in G.modules())
    t0 = time.perf_counter()
    generate_from_checkpoint(pkl, tree, n=n, seed=0, device="cuda", trust_pickles=True)
    result["generate_from_checkpoint_images_per_s"] = round(n / (time.perf_counter() - t0), 2)
    result["plugins"] = sorted(PLUGINS)
    return result


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
