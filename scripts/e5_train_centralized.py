"""Snakemake entry point: E5's federated (FedAvg) or central cGAN training, resumable."""

from distrank._io import logged
from distrank.experiments.e5_federated_training import train

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    train(
        sm.input.images,
        sm.input.manifest,
        sm.output[0],
        run=sm.wildcards.run,
        settings=sm.params.settings,
        seed=sm.params.seed,
        checkpoint_dir=sm.params.checkpoint_dir,
        threads=sm.threads,
        device=sm.params.device,
    )
