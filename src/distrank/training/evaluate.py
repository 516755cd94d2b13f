"""Training checkpoints to scored models: a bundle of checkpoints, and each one's features.

A training job ends by writing its checkpoints, by model name, into one bundle file
(:func:`save_bundle`; zoo states, read back with ``weights_only=True``). Each
checkpoint then becomes a model like any other of the zoo: ``n`` images drawn with
:func:`distrank.zoo.sample` under one seed (the same latents for every checkpoint, so
curves over training compare like with like), saved with
:func:`distrank.data.images.save_images`, and passed through the pipeline's feature
step (:func:`distrank.features.cache.extract_to_file` with the configured extractor).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from distrank._progress import progress
from distrank.data.images import save_images
from distrank.zoo import load_state, sample, save_state

__all__ = ["checkpoint_features", "load_bundle", "save_bundle"]


def save_bundle(path, checkpoints: Mapping[str, dict]) -> None:
    """Write ``{model name: zoo state}`` atomically.

    Parameters
    ----------
    path : str or os.PathLike
        The bundle file (:func:`distrank.zoo.save_state`).
    checkpoints : mapping of str to dict
        Model name -> zoo state, as :func:`distrank.zoo.sample` reads it.
    """
    save_state(path, {"checkpoints": dict(checkpoints)})


def load_bundle(path) -> dict[str, dict]:
    """The ``{model name: zoo state}`` of :func:`save_bundle`.

    Parameters
    ----------
    path : str or os.PathLike
        A bundle file written by :func:`save_bundle`.

    Returns
    -------
    dict of str to dict
        Model name -> zoo state (tensors on the CPU; :func:`distrank.zoo.load_state`).
    """
    return load_state(path)["checkpoints"]


def load_checkpoints(inputs: Mapping, models: list[str]) -> dict[str, dict]:
    """The checkpoints a job scores: a ``bundle`` (:func:`save_bundle`) or one zoo
    ``state``, named after ``models[0]``."""
    if "bundle" in inputs:
        return load_bundle(inputs["bundle"])
    return {models[0]: load_state(inputs["state"])}


def checkpoint_features(
    checkpoints: Mapping[str, dict],
    features: Mapping[str, str],
    *,
    extractor,
    n: int,
    seed: int,
    image_dir,
    batch_size: int | None = None,
    threads: int = 2,
) -> None:
    """Sample ``n`` images of every checkpoint and write their features.

    ``features`` maps each model name to its feature file; the images go to
    ``image_dir/model_<name>.npz``. ``extractor`` is the study's feature extractor
    (``get_extractor``).

    Parameters
    ----------
    checkpoints : mapping of str to dict
        Model name -> zoo state (:func:`load_bundle`).
    features : mapping of str to str
        Model name -> its feature file; every name must be in ``checkpoints``.
    extractor : Extractor
        The feature network.
    n : int
        Images sampled per checkpoint.
    seed : int
        The sampling seed, the same for every checkpoint (the same latents).
    image_dir : str or os.PathLike
        Folder of the sampled images.
    batch_size : int, optional
        Images per forward pass (None: the extractor's default).
    threads : int
        CPU threads of the sampling (:func:`distrank.zoo.sample`).

    Raises
    ------
    ValueError
        ``features`` names a model that ``checkpoints`` lacks.
    """
    from distrank.features.cache import extract_to_file

    missing = sorted(set(features) - set(checkpoints))
    if missing:
        raise ValueError(
            f"features: no checkpoint named {missing}; the bundle has {sorted(checkpoints)}"
        )
    for name in progress(list(features), desc="checkpoint features", unit="model"):
        images, labels = sample(checkpoints[name], n, seed=seed, threads=threads)
        path = save_images(Path(image_dir) / f"model_{name}.npz", images, labels, model=name)
        extract_to_file(path, features[name], extractor, batch_size=batch_size)
