"""The model zoo of the default study: generators and degradations with a known order.

- :mod:`~distrank.zoo.cgan`: a class-conditional GAN with a truncation knob (BigGAN's role).
- :mod:`~distrank.zoo.vae`: a class-conditional VAE with a temperature knob.
- :mod:`~distrank.zoo.diffusion`: a class-conditional denoising diffusion model with a
  classifier-free guidance knob.
- :mod:`~distrank.zoo.degrade`: mode dropping, noise and blur of held-out real images.
- :mod:`~distrank.zoo.feature_space`: models made in feature space (no network), E4's
  simulated and fitted families.

Models are trained on uint8 images (N, H, W) with int labels, on CPU, seeded
(:mod:`~distrank.zoo.families` holds what the learned families share). A trained
model is a *state*: a dict of plain Python values and tensors (``family``, ``config``,
``generator`` weights, ``history``) that :func:`save_state` writes with ``torch.save`` and
:func:`load_state` reads with ``weights_only=True`` (no pickle of code). Samples are
saved with :func:`distrank.data.images.save_images`.

torch is imported lazily, so degradations work without it.
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

from distrank._io import atomic_open

__all__ = [
    "FAMILIES",
    "FROM_HELDOUT",
    "KINDS",
    "KNOBS",
    "check_knob",
    "train",
    "sample",
    "make_images",
    "save_state",
    "load_state",
    "torch_session",
    "deterministic_algorithms",
]

#: Learned families, name -> module under distrank.zoo with train_<name>/sample_<name>.
FAMILIES = ("cgan", "vae", "diffusion")
#: Model kinds made from the held-out real images (the real model and its degradations).
FROM_HELDOUT = ("heldout", "noise", "blur", "mode_drop")
#: Every kind of model in a config's ``models``: the families (sampled from a state
#: trained in the DAG), the held-out kinds, ``images`` (a source's first images) and
#: ``checkpoint`` (a published network pickle).
KINDS = FAMILIES + FROM_HELDOUT + ("images", "checkpoint")
#: The knobs a model of each kind may set in its spec (what a diversity sweep may vary):
#: the families' samplers' arguments, the degradations' levels, a checkpoint's options.
KNOBS = {
    "cgan": ("truncation", "psi"),
    "vae": ("temperature",),
    "diffusion": ("guidance", "sample_steps"),
    "heldout": (),
    "noise": ("sigma",),
    "blur": ("sigma",),
    "mode_drop": ("n_drop",),
    "checkpoint": ("truncation_psi", "class_idx", "num_steps"),
}


def check_knob(kind: str, knob: str, where: str) -> None:
    """ValueError naming ``where`` unless ``knob`` is one of a ``kind`` model's knobs.

    Parameters
    ----------
    kind : str
        The model's kind (a key of :data:`KNOBS`; another kind has no knobs).
    knob : str
        The knob to check.
    where : str
        Where it was set, e.g. the config key, to begin the error message.

    Raises
    ------
    ValueError
        ``knob`` is not in ``KNOBS[kind]``.
    """
    if knob not in KNOBS.get(kind, ()):
        raise ValueError(
            f"{where}: a {kind} model has no knob {knob!r}; its knobs: {list(KNOBS.get(kind, ()))}"
        )


# Images per network load when a checkpoint's images are resized: FFHQ's 1024 px
# StyleGAN2-ADA makes 3 MB per image, so this bounds memory to a few GB.
CHECKPOINT_CHUNK = 1000


def train(family: str, images, labels, *, seed: int, **params) -> dict:
    """Train a model of ``family``; returns its state.

    Parameters
    ----------
    family : str
        One of ``FAMILIES``: ``"cgan"``, ``"vae"``, ``"diffusion"``.
    images : numpy.ndarray of uint8, shape (N, H, W)
        The training images.
    labels : array_like of int, shape (N,)
        The class of each image.
    seed : int
        Seed of the training.
    **params
        The family trainer's options (:func:`~distrank.zoo.cgan.train_cgan`,
        :func:`~distrank.zoo.vae.train_vae`, :func:`~distrank.zoo.diffusion.train_diffusion`).

    Returns
    -------
    dict
        The state: ``family``, ``config``, ``generator`` (tensors), ``history``.

    Raises
    ------
    ValueError
        An unknown ``family``.
    """
    return getattr(_module(family), f"train_{family}")(images, labels, seed=seed, **params)


def sample(state: dict, n: int, *, seed: int, **knobs):
    """Draw ``n`` samples from a trained state; ``knobs`` are the family's (truncation,
    temperature, labels). Returns (images uint8 (n, H, W), labels int64 (n,)).

    Parameters
    ----------
    state : dict
        A trained state (:func:`train`, :func:`load_state`); its ``family`` picks the
        sampler.
    n : int
        Number of samples.
    seed : int
        Seed of the sampling.
    **knobs
        The family sampler's options (:func:`~distrank.zoo.cgan.sample_cgan`,
        :func:`~distrank.zoo.vae.sample_vae`, :func:`~distrank.zoo.diffusion.sample_diffusion`).

    Returns
    -------
    images : numpy.ndarray of uint8, shape (n, H, W)
    labels : numpy.ndarray of int64, shape (n,)

    Raises
    ------
    ValueError
        A state whose ``family`` is not one of ``FAMILIES``.
    """
    family = state.get("family")
    return getattr(_module(family), f"sample_{family}")(state, n, seed=seed, **knobs)


def write_images(out, spec: dict, n: int, *, name: str = "model", **options) -> None:
    """:func:`make_images` of one model, saved to ``out`` with its name and spec."""
    from distrank.data.images import save_images

    images, labels = make_images(spec, n, name=name, **options)
    save_images(out, images, labels, model=name, spec=dict(spec))


def make_images(
    spec: dict,
    n: int,
    *,
    seed: int,
    inputs: dict,
    paths: dict | None = None,
    batch_size: int = 64,
    device=None,
    trust_pickles: bool = False,
    workers: int = 1,
    name: str = "model",
    state: dict | None = None,
    **sampling,
):
    """The images of one model of a config's ``models`` (``spec``, with its ``kind``).

    ``inputs`` holds what the kind reads: ``state`` (a family's trained state file;
    or give the loaded ``state``), ``heldout`` (the held-out images npz), ``checkpoint``
    and ``code`` (a published network pickle and its upstream source); ``paths``
    locate an ``images`` source (``artifact -> path``). ``sampling`` goes to a family's
    sampler (``labels``, ``threads``). Returns (images uint8, labels or None).

    Parameters
    ----------
    spec : dict
        The model's entry: ``kind`` (one of :data:`KINDS`) and its knobs or options.
    n : int
        Number of images (the held-out kinds ignore it: they keep the held-out count).
    seed : int
        Seed of the sampling, the degradation or the checkpoint's latents.
    inputs : dict
        The files the kind reads (above).
    paths : dict, optional
        Artifact name -> local path, for an ``images`` kind's source.
    batch_size : int
        Images per forward pass of a ``checkpoint`` network.
    device : str, optional
        Where a ``checkpoint`` network runs (None: CUDA when available).
    trust_pickles : bool
        Must be True for a ``checkpoint``: loading its pickle executes code.
    workers : int
        Processes that decode an ``images`` source.
    name : str
        The model's name, in error messages.
    state : dict, optional
        A family's loaded state, used instead of reading ``inputs["state"]``.
    **sampling
        Passed to a family's sampler.

    Returns
    -------
    images : numpy.ndarray of uint8, shape (m, H, W) or (m, H, W, C)
        m = n, but the held-out kinds' m is the held-out file's row count.
    labels : numpy.ndarray of int, shape (m,), or None

    Raises
    ------
    ValueError
        An unknown ``kind``, or an ``images`` source with fewer than ``n`` images.
    """
    spec = dict(spec)
    kind = spec.pop("kind")
    if kind not in KINDS:
        raise ValueError(f"models.{name}.kind: unknown {kind!r}; expected one of {KINDS}")
    if kind in FAMILIES:
        state = load_state(inputs["state"]) if state is None else state
        return sample(state, n, seed=seed, **spec, **sampling)
    if kind == "images":
        return _source_images(spec["source"], n, paths=paths, workers=workers, name=name)
    if kind == "checkpoint":
        return _checkpoint_images(
            spec,
            n,
            seed=seed,
            inputs=inputs,
            batch_size=batch_size,
            device=device,
            trust_pickles=trust_pickles,
        )
    from distrank.data.images import load_images
    from distrank.zoo.degrade import degrade

    images, labels = load_images(inputs["heldout"])
    if kind == "heldout":
        return images, labels
    (level,) = spec.values()
    return degrade(kind, images, labels, level=level, seed=seed)


def _source_images(source, n, *, paths, workers, name):
    """The first n images of a source (streamed from ADM batches)."""
    from distrank.data.sources import load_source

    images, labels = load_source({**source, "max_images": n}, paths=paths, workers=workers)
    if len(images) < n:
        raise ValueError(
            f"models.{name}: its source has {len(images)} images, fewer than n_samples={n}"
        )
    return images, labels


def _checkpoint_images(spec, n, *, seed, inputs, batch_size, device, trust_pickles):
    from distrank.data.sources import resize_images
    from distrank.zoo.checkpoints import generate_from_checkpoint

    options = {k: spec[k] for k in ("truncation_psi", "class_idx", "num_steps") if k in spec}

    def generate(start, count):
        return generate_from_checkpoint(
            inputs["checkpoint"],
            inputs["code"],
            n=count,
            seed=seed + start,
            batch_size=batch_size,
            device=device,
            trust_pickles=trust_pickles,
            **options,
        )

    if "resolution" not in spec:
        return generate(0, n)
    # Image i depends only on seed + i (StyleGAN2-ADA makes each in a forward pass of
    # its own, as upstream's generate.py: see zoo.checkpoints), so chunks make the same
    # images as one call, bit for bit; each chunk is resized before the next is made.
    size = spec["resolution"]
    size = (size, size) if isinstance(size, int) else tuple(size)
    images, labels = [], []
    for start in range(0, n, CHECKPOINT_CHUNK):
        chunk, chunk_labels = generate(start, min(CHECKPOINT_CHUNK, n - start))
        images.append(resize_images(chunk, size))
        labels.append(chunk_labels)
    return np.concatenate(images), None if labels[0] is None else np.concatenate(labels)


def _module(family):
    if family not in FAMILIES:
        raise ValueError(f"argument 'family': unknown {family!r}; expected one of {FAMILIES}")
    import importlib

    return importlib.import_module(f"{__name__}.{family}")


def save_state(path, state: dict) -> None:
    """Write a model state with ``torch.save`` (atomically).

    Parameters
    ----------
    path : str or os.PathLike
        The file to write.
    state : dict
        The state (:func:`train`).
    """
    import torch

    with atomic_open(path) as handle:
        torch.save(state, handle)


def load_state(path) -> dict:
    """Read a state written by :func:`save_state`; tensors only, no code is unpickled.

    Parameters
    ----------
    path : str or os.PathLike
        The state file.

    Returns
    -------
    dict
        The state, its tensors on the CPU.
    """
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


@contextlib.contextmanager
def torch_session(seed: int, threads: int = 2):
    """Run torch code reproducibly without leaking global state.

    Inside: the global RNG is seeded with ``seed`` (and restored afterwards), at most
    ``threads`` intra-op threads are used, and deterministic algorithms are enforced.

    Parameters
    ----------
    seed : int
        Seed of torch's global RNG inside.
    threads : int
        Most intra-op threads inside (never more than already set, at least 1).

    Returns
    -------
    contextlib.AbstractContextManager
        A context manager (yielding None); thread count and determinism are restored
        on exit.
    """
    import torch

    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(max(1, min(threads, prev_threads)))
        deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.set_num_threads(prev_threads)
            deterministic_algorithms(prev_det)


def deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """``torch.use_deterministic_algorithms(mode, warn_only=warn_only)`` without the
    import of ``torch._inductor`` (and with it ``torch._dynamo`` and sympy) that it makes
    to set a flag only ``torch.compile`` reads: 1.3 CPU-s, a third of a small job's
    start. The kernels' flag is set as the public call sets it; the public call is made
    where ``torch._inductor`` is already loaded, or where the flag's setter is gone.

    Parameters
    ----------
    mode : bool
        Whether torch's kernels must be deterministic (or raise, or warn).
    warn_only : bool
        A kernel without a deterministic version warns instead of raising.
    """
    import torch

    set_flag = getattr(torch._C, "_set_deterministic_algorithms", None)
    if set_flag is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        set_flag(mode, warn_only=warn_only)
