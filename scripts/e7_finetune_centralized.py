"""Snakemake entry point: E7's MMD fine-tuning of the zoo's cGAN by one method, resumable."""

from distrank._io import logged
from distrank.experiments.e7_mmd_finetuning import finetune

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    inputs = dict(sm.input.items())
    finetune(
        inputs["state"],
        inputs["manifest"],
        sm.output[0],
        method=sm.wildcards.method,
        settings=sm.params.settings,
        seed=sm.params.seed,
        checkpoint_dir=sm.params.checkpoint_dir,
        threads=sm.threads,
        reference_features=inputs.get("reference_features"),
        reference_images=inputs.get("reference_images"),
        device=sm.params.device,
    )
