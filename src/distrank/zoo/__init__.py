"""The model zoo of the default study: generators and degradations with a known order.

- :mod:`~distrank.zoo.cgan`: a class-conditional GAN with a truncation knob (BigGAN's role).
- :mod:`~distrank.zoo.vae`: a class-conditional VAE with a temperature knob.
- :mod:`~distrank.zoo.degrade`: mode dropping, noise and blur of held-out real images.

Models are trained on uint8 images (N, H, W) with int labels, on CPU, seeded. A trained
model is a *state*: a dict of plain Python values and tensors (``family``, ``config``,
``generator`` weights, ``history``) that :func:`save_state` writes with ``torch.save`` and
:func:`load_state` reads with ``weights_only=True`` (no pickle of code). Samples are
saved with :func:`distrank.data.images.save_images`.

torch is imported lazily, so degradations work without it.
"""

from __future__ import annotations

import contextlib

import numpy as np

from distrank._io import atomic_open

__all__ = [
    "FAMILIES",
    "train",
    "sample",
    "save_state",
    "load_state",
    "torch_session",
]

#: Learned families: name -> module under distrank.zoo with train_<name>/sample_<name>.
FAMILIES = ("cgan", "vae")


def train(family: str, images, labels, *, seed: int, **params) -> dict:
    """Train a model of ``family`` (``"cgan"`` or ``"vae"``); returns its state."""
    return getattr(_module(family), f"train_{family}")(images, labels, seed=seed, **params)


def sample(state: dict, n: int, *, seed: int, **knobs):
    """Draw ``n`` samples from a trained state; ``knobs`` are the family's (truncation,
    temperature, labels). Returns (images uint8 (n, H, W), labels int64 (n,))."""
    family = state.get("family")
    return getattr(_module(family), f"sample_{family}")(state, n, seed=seed, **knobs)


def _module(family):
    if family not in FAMILIES:
        raise ValueError(f"argument 'family': unknown {family!r}; expected one of {FAMILIES}")
    import importlib

    return importlib.import_module(f"{__name__}.{family}")


def save_state(path, state: dict) -> None:
    """Write a model state with ``torch.save`` (atomically)."""
    import torch

    with atomic_open(path) as handle:
        torch.save(state, handle)


def load_state(path) -> dict:
    """Read a state written by :func:`save_state`; tensors only, no code is unpickled."""
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


@contextlib.contextmanager
def torch_session(seed: int, threads: int = 2):
    """Run torch code reproducibly without leaking global state.

    Inside: the global RNG is seeded with ``seed`` (and restored afterwards), at most
    ``threads`` intra-op threads are used, and deterministic algorithms are enforced.
    """
    import torch

    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(max(1, min(threads, prev_threads)))
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.set_num_threads(prev_threads)
            torch.use_deterministic_algorithms(prev_det)


def to_float(images):
    """uint8 images (N, H, W) -> float32 tensor (N, 1, H, W) in [-1, 1]."""
    import torch

    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(f"argument 'images' must be uint8 (N,H,W), got {images.dtype} "
                         f"{images.shape}")
    return torch.from_numpy(images.astype(np.float32)).div_(127.5).sub_(1.0).unsqueeze(1)


def to_uint8(x) -> np.ndarray:
    """float tensor (N, 1, H, W) in [-1, 1] -> uint8 images (N, H, W)."""
    import torch

    return x.squeeze(1).add(1.0).mul(127.5).round().clamp(0, 255).to(torch.uint8).numpy()


def check_labels(labels, n, n_classes=None) -> np.ndarray:
    """Validate int labels of length ``n`` (in ``0..n_classes-1`` when given)."""
    labels = np.asarray(labels)
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"argument 'labels' must be {n} ints, got {labels.dtype} {labels.shape}")
    if n_classes is not None and n and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"argument 'labels' must lie in 0..{n_classes - 1}")
    return labels.astype(np.int64)
