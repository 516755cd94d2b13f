"""E4's pre-steps (``STEPS``): the sweep models' images and features, the fitted
family's features and FD in several settings, each a function of the rule's files
(``write_*``) and its :class:`~distrank.experiments.Job` wrapper."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from distrank.experiments import Job
from distrank.experiments.e4_diversity_sweep.sweep import (
    FEATURE_KINDS,
    FITTED,
    SIMULATED,
    sweep_models,
)
from distrank.metrics.fd._settings import FdSettings
from distrank.zoo.feature_space import fitted_samples, pull_to_class_means

__all__ = [
    "sweep_inputs",
    "partition_classes",
    "write_sweep",
    "write_fitted",
    "write_fd",
    "STEPS",
]


def sweep_inputs(settings: Mapping, model_files, heldout_features: str) -> dict[str, str]:
    """What the sweep's families are made from, as :func:`write_sweep` reads it: each
    family's files by ``model_files(spec)`` (the workflow's, e.g. ``{"state": path}``)
    named ``<name>_<family>`` (``heldout``, shared, keeps its name), and
    ``heldout_features`` for the simulated family (the fitted family has its own
    pre-step, :func:`write_fitted`)."""
    inputs = {}
    for family, spec in settings["families"].items():
        if spec["kind"] == SIMULATED:
            inputs["heldout_features"] = heldout_features
        if spec["kind"] in FEATURE_KINDS:
            continue
        for name, path in model_files(spec).items():
            inputs[name if name == "heldout" else f"{name}_{family}"] = path
    return inputs


def partition_classes(scheme: Mapping) -> list[int] | None:
    """The classes that a partition's clients hold (``None``: all of them, or unknown)."""
    if scheme["kind"] == "one_class":
        return scheme.get("classes")
    if scheme["kind"] == "by_class":
        return sorted(c for group in scheme["groups"] for c in group)
    return None


def write_sweep(
    settings: Mapping,
    inputs: Mapping,
    outputs: Mapping,
    *,
    n_samples: int,
    seed: int,
    classes: Sequence[int] | None,
    features: Mapping,
    batch_size: int,
    device=None,
    trust_pickles: bool = False,
    threads: int = 1,
) -> None:
    """Pre-step (one job): the images and features of every sweep model but the
    fitted family's (:func:`write_fitted`).

    ``inputs`` holds ``state_<family>`` (a trained zoo state), ``checkpoint_<family>``
    and ``code_<family>`` (a published network), ``heldout`` (held-out images) and
    ``heldout_features`` (for the simulated family) as the families need;
    ``outputs`` maps each model to its ``images`` (image families) and ``features``
    paths. Every knob value of a family uses the same seed (shared latents): ``seed``
    plus the model's sampling seed.
    """
    from distrank import zoo
    from distrank.data.images import save_images
    from distrank.features import extractor_from_config
    from distrank.features.cache import extract_to_file

    extractor = None
    states = {}
    for name, model in sweep_models(settings).items():
        spec, family = dict(model["spec"]), model["family"]
        kind = spec["kind"]
        if kind in FEATURE_KINDS:
            if kind == SIMULATED:
                _write_simulated(inputs["heldout_features"], classes, model["value"], outputs[name])
            continue
        own = {
            "checkpoint": inputs.get(f"checkpoint_{family}"),
            "code": inputs.get(f"code_{family}"),
            "heldout": inputs.get("heldout"),
        }
        sampling = {}
        if kind in zoo.FAMILIES:  # one state per family, class-conditional on the clients'
            if family not in states:
                states[family] = zoo.load_state(inputs[f"state_{family}"])
            labels = None if classes is None else np.resize(np.asarray(classes), n_samples)
            sampling = {"state": states[family], "labels": labels, "threads": threads}
        images, labels = zoo.make_images(
            spec,
            n_samples,
            seed=seed + model["seed"],
            inputs=own,
            batch_size=batch_size,
            device=device,
            trust_pickles=trust_pickles,
            name=name,
            **sampling,
        )
        save_images(outputs[name]["images"], images, labels, model=name, spec=spec)
        if extractor is None:  # loaded once for the whole sweep
            extractor = extractor_from_config(features, device=device, threads=threads)
        extract_to_file(
            outputs[name]["images"],
            outputs[name]["features"],
            extractor,
            batch_size=features["batch_size"],
        )


def _write_simulated(heldout_path, classes, tau: float, output: Mapping) -> None:
    """The simulated family's features at ``tau``: the held-out rows of ``classes``
    pulled to their class means
    (:func:`~distrank.zoo.feature_space.pull_to_class_means`), with their labels."""
    from distrank._io import atomic_path
    from distrank.features.cache import load_features, read_array

    x, labels = load_features(heldout_path), read_array(heldout_path, key="labels")
    if classes is not None:
        keep = np.isin(labels, classes)
        x, labels = x[keep], labels[keep]
    with atomic_path(output["features"]) as tmp:
        np.savez(tmp, features=pull_to_class_means(x, labels, tau), labels=labels)


def sweep_centralized(job: Job) -> None:
    """Pre-step ``e4_sweep_models``: :func:`write_sweep` on the rule's files."""
    params = job.params
    outputs = {m: {"features": path} for m, path in zip(params["models"], job.outputs["features"])}
    for name, path in zip(params["image_models"], job.outputs["images"]):
        outputs[name]["images"] = path
    options = ("n_samples", "seed", "classes", "features", "batch_size", "device")
    write_sweep(
        params["settings"], job.inputs, outputs, **job.args(*options, "trust_pickles", "threads")
    )


# -- The fitted family: Theorem 2's own setting on the clients' statistics ------------


def write_fitted(
    settings: Mapping,
    client_paths: Sequence,
    outputs: Mapping[str, str],
    *,
    n_samples: int,
    seed: int,
    weights: str,
) -> None:
    """Pre-step: the features of every fitted-family model,
    :func:`~distrank.zoo.feature_space.fitted_samples` of the clients' files, to
    ``outputs[name]``; seed ``seed`` plus the model's sampling seed, as the image
    families."""
    from distrank._io import atomic_path
    from distrank.features.cache import load_features

    clients = [load_features(p) for p in client_paths]
    fitted = {n: m for n, m in sweep_models(settings).items() if m["spec"]["kind"] == FITTED}
    for family, draw_seed in dict.fromkeys((m["family"], m["seed"]) for m in fitted.values()):
        mine = {n: m for n, m in fitted.items() if (m["family"], m["seed"]) == (family, draw_seed)}
        draws = fitted_samples(
            clients,
            [m["value"] for m in mine.values()],
            n_samples=n_samples,
            seed=seed + draw_seed,
            weights=weights,
        )
        for name, model in mine.items():
            features, labels = draws[model["value"]]
            with atomic_path(outputs[name]) as tmp:
                np.savez(tmp, features=features, labels=labels)


def fitted_centralized(job: Job) -> None:
    """Pre-step ``e4_fitted_centralized``: :func:`write_fitted` on the rule's files."""
    write_fitted(
        job.params["settings"],
        job.inputs["clients"],
        dict(zip(job.params["models"], job.outputs["features"])),
        **job.args("n_samples", "seed", "weights"),
    )


# -- FD estimated well: PCA projections, extrapolation to infinite samples, its terms --


def write_fd(
    settings: Mapping,
    client_paths: Sequence,
    model_paths: Mapping[str, str],
    fd_path,
    theory_path,
    *,
    weights: str,
    seed: int,
    threads: int = 1,
) -> None:
    """Pre-step: ``FdSettings.table`` of every sweep
    model (``fd_path``) and ``FdSettings.theory`` at
    the fitted families' scales (``theory_path``), CSV."""
    from distrank._io import atomic_open
    from distrank.features.cache import load_features, load_labelled
    from distrank.zoo import torch_session

    models = sweep_models(settings)
    scales = sorted({m["value"] for m in models.values() if m["spec"]["kind"] == FITTED})
    with torch_session(seed, threads):
        fd = FdSettings(
            [load_features(p) for p in client_paths],
            pca_dims=settings.get("pca_dims", []),
            extrapolation=settings.get("extrapolation"),
            weights=weights,
            seed=seed,
        )
        table = fd.table((name, *load_labelled(model_paths[name])) for name in models)
        theory = fd.theory(scales)
    for path, frame in ((fd_path, table), (theory_path, theory)):
        with atomic_open(path, "w") as f:
            frame.to_csv(f, index=False, lineterminator="\n")


def fd_centralized(job: Job) -> None:
    """Pre-step ``e4_fd_centralized``: :func:`write_fd` on the rule's files."""
    write_fd(
        job.params["settings"],
        job.inputs["clients"],
        dict(zip(job.params["models"], job.inputs["models"])),
        job.outputs["fd"],
        job.outputs["theory"],
        **job.args("weights", "seed", "threads"),
    )


STEPS = {
    "e4_sweep_models": sweep_centralized,
    "e4_fitted_centralized": fitted_centralized,
    "e4_fd_centralized": fd_centralized,
}
