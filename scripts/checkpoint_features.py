"""Snakemake entry point: features of training checkpoints (a bundle, or one zoo state)."""

from distrank import zoo
from distrank._io import logged
from distrank.features import extractor_from_config
from distrank.training.evaluate import checkpoint_features, load_bundle

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    inputs = dict(sm.input.items())
    models = sm.params.models
    checkpoints = (
        load_bundle(inputs["bundle"])
        if "bundle" in inputs
        else {models[0]: zoo.load_state(inputs["state"])}
    )
    cfg = sm.params.features
    extractor = extractor_from_config(cfg, device=sm.params.device, threads=sm.threads)
    checkpoint_features(
        checkpoints,
        dict(zip(models, sm.output)),
        extractor=extractor,
        n=sm.params.n_samples,
        seed=sm.params.seed,
        image_dir=sm.params.image_dir,
        batch_size=cfg["batch_size"],
        threads=sm.threads,
    )
