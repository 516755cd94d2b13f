"""Snakemake entry point: features of training checkpoints (a bundle, or one zoo state)."""

from distrank._io import logged
from distrank.features import extractor_from_config
from distrank.training.evaluate import checkpoint_features, load_checkpoints

sm, cfg = snakemake, snakemake.params.features  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    checkpoint_features(
        load_checkpoints(dict(sm.input.items()), sm.params.models),
        dict(zip(sm.params.models, sm.output)),
        extractor=extractor_from_config(cfg, device=sm.params.device, threads=sm.threads),
        n=sm.params.n_samples,
        seed=sm.params.seed,
        image_dir=sm.params.image_dir,
        batch_size=cfg["batch_size"],
        threads=sm.threads,
    )
