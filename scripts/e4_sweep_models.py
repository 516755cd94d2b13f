"""Snakemake entry point: the images and features of every model of E4's sweep, in one job."""

from distrank._io import logged
from distrank.experiments.e4_diversity_sweep import write_sweep

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    outputs = {name: {"features": path} for name, path in zip(sm.params.models, sm.output.features)}
    for name, path in zip(sm.params.image_models, sm.output.images):
        outputs[name]["images"] = path
    write_sweep(
        sm.params.settings,
        dict(sm.input.items()),
        outputs,
        n_samples=sm.params.n_samples,
        seed=sm.params.seed,
        classes=sm.params.classes,
        features=sm.params.features,
        batch_size=sm.params.batch_size,
        device=sm.params.device,
        trust_pickles=sm.params.trust_pickles,
        threads=sm.threads,
    )
