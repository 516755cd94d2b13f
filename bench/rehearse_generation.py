"""The rehearsal's generation stage (``rehearse.py``'s doc): tiny networks of upstream's
own classes pickled as upstream's training loops write them, our generation against
upstream's own sampling code, and the GPU speed stage."""

from __future__ import annotations

import copy
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from distrank.zoo.checkpoints import generate_from_checkpoint  # noqa: E402
from distrank.zoo.upstream import PLUGINS, upstream_code  # noqa: E402

SEEDS = 8  # images compared per network


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
