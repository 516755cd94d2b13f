"""Samples from published generator checkpoints: StyleGAN2-ADA and EDM network pickles.

These pickles hold the networks as Python objects whose classes live in the
upstream repositories (``dnnlib``, ``torch_utils``, ``training``); StyleGAN2-ADA's
even embed their source code, which ``torch_utils.persistence`` executes on
load. **Unpickling one runs arbitrary code**, so :func:`generate_from_checkpoint`
refuses unless the caller passes ``trust_pickles=True`` (the config's
``trust_pickles: true``), and the upstream code is a GitHub archive pinned by
commit (``UPSTREAMS``) that the pipeline downloads and
extracts like any other artifact; :func:`distrank.zoo.upstream.upstream_code` makes
it importable while a pickle is loaded and sampled.

Seeding follows the upstream ``generate.py`` scripts, so image ``i`` of
``generate_from_checkpoint(..., seed=s)`` is the image upstream writes for seed
``s + i`` (same device and settings):

- StyleGAN2-ADA: ``z = np.random.RandomState(s + i).randn(1, G.z_dim)``, then
  ``G(z, c, truncation_psi=psi, noise_mode='const')``. A conditional network
  (``G.c_dim > 0``, e.g. ``cifar10.pkl``) gets ``class_idx`` for every image, or
  else a class drawn uniformly from the same RandomState right after ``z``.
  **One image per forward pass**, as upstream's ``generate.py`` does: a network
  with fp16 blocks (upstream's default ``num_fp16_res=4``) computes a batch of one
  with fused modulated convolutions and a larger batch without, which changes
  pixels by a grey level (2.5-6 % of them between batches of 8 and 1); and the
  mapping network's matrix products may sum in another order at another batch
  size. So the images are ``generate.py``'s, bit for bit, on the same device and
  torch build (checked against upstream's code by ``bench/rehearse.py``), and
  ``batch_size`` only sets how many latents are drawn per step.
- EDM: a ``torch.Generator(device)`` seeded with ``s + i`` draws the latent and
  then (conditional nets) the class; sampling is EDM's deterministic 2nd-order
  Heun sampler (Karras et al. 2022, Algorithm 2 without churn), ``batch_size``
  images per forward pass (EDM's networks run fp32 except on CUDA with
  ``use_fp16``; the rehearsal checks batch sizes 1, 3 and 8 against upstream's
  ``generate.py`` on the CPU).

Each image depends only on ``s + i``: not on ``n``, ``batch_size``, the chunk it
is made in or the other images. Consequences: the same seed at several truncation
psi values gives the same latents (common random numbers, so the psi effect is
isolated), and seeds ``s`` and ``s + 1`` share all but one latent, so do not use
neighbouring seeds for sets meant to be independent. Images are converted as
upstream does: ``(x * 127.5 + 128).clamp(0, 255)`` to uint8, NHWC.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from distrank._checks import positive_int

from .upstream import find_code_root, upstream_code

__all__ = [
    "CHECKPOINT_BASE_URLS",
    "UntrustedPickleError",
    "edm_sample",
    "generate_from_checkpoint",
]

#: Published checkpoints, for the configs' downloads (no checksums are published).
CHECKPOINT_BASE_URLS = {
    "stylegan2_ada": "https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/",
    "edm": "https://nvlabs-fi-cdn.nvidia.com/edm/pretrained/",
}


class UntrustedPickleError(PermissionError):
    """A network pickle was to be loaded without ``trust_pickles=True``."""


def generate_from_checkpoint(
    pkl_path: str | os.PathLike,
    code_dir: str | os.PathLike,
    *,
    n: int,
    seed: int,
    truncation_psi: float = 1.0,
    class_idx: int | None = None,
    batch_size: int = 64,
    device: str | None = None,
    trust_pickles: bool = False,
    noise_mode: str = "const",
    num_steps: int = 18,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Generate ``n`` images from a StyleGAN2-ADA or EDM network pickle.

    The family is recognised from the pickle: a dict with ``G_ema`` (StyleGAN2-ADA,
    loaded with the upstream ``legacy.load_network_pkl`` when ``code_dir`` has it,
    which also converts old TensorFlow pickles) or ``ema`` (EDM, plain
    ``pickle.load`` as upstream does).

    Parameters
    ----------
    pkl_path : str or os.PathLike
        The network pickle.
    code_dir : str or os.PathLike
        The upstream source tree (holding ``dnnlib/`` and ``torch_utils/``), or the
        folder it was extracted to (GitHub's single ``<repo>-<commit>/``); on
        ``sys.path`` only while loading and generating, then restored with the modules.
    n, seed : int
        Number of images; image i uses seed ``seed + i`` (see the module doc).
    truncation_psi : float
        StyleGAN2-ADA's truncation; 1 is none (EDM: must be 1).
    class_idx : int, optional
        The class of every image of a conditional network; None draws one per image.
    batch_size : int
        Latents drawn per step (StyleGAN2-ADA) or images per forward pass (EDM).
    device : str, optional
        "cuda", "cpu", ...; None picks CUDA when available.
    trust_pickles : bool
        Must be True: loading the pickle executes code from it.
    noise_mode : str
        StyleGAN2-ADA's per-layer noise, "const" (upstream's default), "random", "none".
    num_steps : int
        EDM sampler steps (18 for CIFAR-10, 40 for the 64x64 models, as in EDM's paper).

    Returns
    -------
    images, labels : np.ndarray
        uint8 (n, H, W, C); int64 (n,) labels of a conditional network, else None.
    """
    pkl_path = Path(pkl_path)
    _check_arguments(pkl_path, n, seed, batch_size, noise_mode, trust_pickles)
    code_root = find_code_root(code_dir)

    import torch

    from distrank._arrays import resolve_device

    device = resolve_device(device)
    with upstream_code(code_root):
        networks = _load_pickle(pkl_path, code_root)
        options = {"truncation_psi": truncation_psi, "class_idx": class_idx}
        options |= {"batch_size": batch_size, "noise_mode": noise_mode, "num_steps": num_steps}
        batches, conditional = _batches(networks, pkl_path, n, seed, device=device, **options)
        with torch.no_grad():
            images, labels = zip(*batches)
    images = np.concatenate(images)
    if images.ndim != 4 or images.shape[3] not in (1, 3):
        raise ValueError(
            f"{pkl_path}: the network made images of shape {images.shape[1:]} "
            "(NHWC), expected 1 or 3 channels"
        )
    return images, np.concatenate(labels) if conditional else None


def _check_arguments(pkl_path: Path, n, seed, batch_size, noise_mode, trust_pickles) -> None:
    if not trust_pickles:
        raise UntrustedPickleError(
            f"refusing to load the network pickle {pkl_path}: unpickling it runs code embedded "
            "in the file (and in the upstream repository it needs) with your permissions. Set "
            "trust_pickles: true in the config (trust_pickles=True) only for checkpoints from "
            "a source you trust, such as NVIDIA's published ones verified by checksum"
        )
    positive_int(n, "argument 'n'")
    positive_int(batch_size, "argument 'batch_size'")
    positive_int(seed, "argument 'seed'", minimum=0)
    if noise_mode not in ("const", "random", "none"):
        raise ValueError(
            f"argument 'noise_mode' must be 'const', 'random' or 'none', got {noise_mode!r}"
        )
    if not pkl_path.is_file():
        raise FileNotFoundError(f"network pickle {pkl_path} does not exist")


def _batches(
    networks,
    pkl_path: Path,
    n,
    seed,
    *,
    truncation_psi,
    class_idx,
    batch_size,
    noise_mode,
    num_steps,
    device,
):
    """The (images, labels) batches of the pickle's network (a lazy generator), and
    whether it is conditional."""
    if "G_ema" in networks:
        net = networks["G_ema"].eval().requires_grad_(False).to(device)
        _check_class(class_idx, net.c_dim, pkl_path)
        batches = _stylegan_batches(
            net, n, seed, truncation_psi, class_idx, batch_size, noise_mode, device
        )
        return batches, net.c_dim > 0
    if "ema" in networks:
        if truncation_psi != 1.0:
            raise ValueError(
                f"{pkl_path} is an EDM network, which has no truncation; "
                f"truncation_psi must be 1, got {truncation_psi}"
            )
        net = networks["ema"].eval().requires_grad_(False).to(device)
        _check_class(class_idx, net.label_dim, pkl_path)
        batches = _edm_batches(net, n, seed, class_idx, batch_size, num_steps, device)
        return batches, net.label_dim > 0
    raise KeyError(
        f"{pkl_path}: expected a StyleGAN2-ADA ('G_ema') or EDM ('ema') "
        f"network pickle, found keys {sorted(map(str, networks))}"
    )


def _load_pickle(pkl_path: Path, code_root: Path) -> dict:
    with open(pkl_path, "rb") as handle:
        if (code_root / "legacy.py").is_file():  # StyleGAN2-ADA: also converts TF pickles
            import legacy

            networks = legacy.load_network_pkl(handle)
        else:  # EDM's generate.py: pickle.load(f)['ema']
            networks = pickle.load(handle)
    if not isinstance(networks, dict):
        raise TypeError(
            f"{pkl_path}: expected a pickled dict of networks, got {type(networks).__name__}"
        )
    return networks


def _check_class(class_idx, n_classes: int, pkl_path: Path) -> None:
    if class_idx is None:
        return
    if n_classes == 0:
        raise ValueError(
            f"{pkl_path} is an unconditional network; class_idx must be None, got {class_idx!r}"
        )
    if not _is_int(class_idx) or not 0 <= class_idx < n_classes:
        raise ValueError(
            f"argument 'class_idx' must be in 0..{n_classes - 1} for {pkl_path}, got {class_idx!r}"
        )


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# ---------------------------------------------------------------------------
# StyleGAN2-ADA


def _stylegan_batches(G, n, seed, truncation_psi, class_idx, batch_size, noise_mode, device):
    """Batches of ``batch_size`` images, each made in a forward pass of its own, as
    upstream's generate.py makes it (see the module doc: batched passes change pixels)."""
    import torch

    for start in range(0, n, batch_size):
        images, labels = [], []
        for s in range(seed + start, seed + min(start + batch_size, n)):
            rs = np.random.RandomState(s % (1 << 32))
            z = torch.from_numpy(rs.randn(1, G.z_dim)).to(device)
            c = torch.zeros([1, G.c_dim], device=device)
            if G.c_dim:
                label = class_idx if class_idx is not None else rs.randint(G.c_dim)
                c[:, label] = 1
                labels.append(label)
            img = G(z, c, truncation_psi=truncation_psi, noise_mode=noise_mode)
            images.append(_to_uint8(img))
        yield np.concatenate(images), np.asarray(labels, dtype=np.int64)


def _to_uint8(img) -> np.ndarray:
    """NCHW floats in [-1, 1] -> NHWC uint8, exactly as upstream's generate.py."""
    import torch

    return (img.permute(0, 2, 3, 1) * 127.5 + 128).clamp(0, 255).to(torch.uint8).cpu().numpy()


# ---------------------------------------------------------------------------
# EDM


def _edm_batches(net, n, seed, class_idx, batch_size, num_steps, device):
    import torch

    for start in range(0, n, batch_size):
        latents, labels = [], []
        for s in range(seed + start, seed + min(start + batch_size, n)):
            gen = torch.Generator(device).manual_seed(s % (1 << 32))
            latents.append(
                torch.randn(
                    [net.img_channels, net.img_resolution, net.img_resolution],
                    generator=gen,
                    device=device,
                )
            )
            if net.label_dim:
                labels.append(
                    int(torch.randint(net.label_dim, size=[], generator=gen, device=device))
                )
        labels = np.asarray(labels, dtype=np.int64)
        class_labels = None
        if net.label_dim:
            if class_idx is not None:
                labels[:] = class_idx
            class_labels = torch.eye(net.label_dim, device=device)[
                torch.from_numpy(labels).to(device)
            ]
        x = edm_sample(net, torch.stack(latents), class_labels, num_steps=num_steps)
        yield _to_uint8(x), labels


def edm_sample(
    net, latents, class_labels=None, *, num_steps=18, sigma_min=0.002, sigma_max=80.0, rho=7.0
):
    r"""EDM's deterministic sampler (Karras et al. 2022, Algorithm 2 with S_churn = 0).

    Noise levels :math:`t_i = (\sigma_{max}^{1/\rho} + \tfrac{i}{N-1}(\sigma_{min}^{1/\rho}
    - \sigma_{max}^{1/\rho}))^\rho`, :math:`t_N = 0`; from :math:`x_0 = t_0 z`, each step
    takes an Euler step along :math:`d = (x - D(x; t)) / t` and, except into
    :math:`t_N = 0`, corrects it with the average slope at the end point (Heun).
    ``net(x, sigma, class_labels)`` is the denoiser D; arithmetic in float64.
    """
    import torch

    sigma_min = max(sigma_min, net.sigma_min)
    sigma_max = min(sigma_max, net.sigma_max)
    i = torch.arange(num_steps, dtype=torch.float64, device=latents.device)
    t = (
        sigma_max ** (1 / rho)
        + i / max(num_steps - 1, 1) * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))
    ) ** rho
    t = torch.cat([net.round_sigma(t), torch.zeros_like(t[:1])])
    x = latents.to(torch.float64) * t[0]
    for step in range(num_steps):
        t_cur, t_next = t[step], t[step + 1]
        slope = (x - net(x, t_cur, class_labels).to(torch.float64)) / t_cur
        x_next = x + (t_next - t_cur) * slope
        if step < num_steps - 1:
            slope_next = (x_next - net(x_next, t_next, class_labels).to(torch.float64)) / t_next
            x_next = x + (t_next - t_cur) * (slope + slope_next) / 2
        x = x_next
    return x
