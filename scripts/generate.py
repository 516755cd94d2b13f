"""Snakemake entry point: one model's images (zoo, published checkpoint, source, degraded, real)."""

from distrank import zoo
from distrank._io import logged

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    zoo.write_images(
        sm.output[0],
        sm.params.spec,
        sm.params.n_samples,
        name=sm.wildcards.model,
        seed=sm.params.seed,
        inputs=dict(sm.input.items()),
        paths=sm.params.paths,
        batch_size=sm.params.batch_size,
        device=sm.params.device,
        trust_pickles=sm.params.trust_pickles,
        workers=sm.threads,
    )
