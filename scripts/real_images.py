"""Snakemake entry point: the reference pool or the held-out real images, a seeded
subset of a source: `per_class` images of each class, or `n` at random."""

from distrank._io import logged
from distrank.data.subsets import save_real_subset

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    save_real_subset(
        sm.output[0],
        sm.params.spec,
        paths=sm.params.paths,
        seed=sm.params.seed,
        where=sm.wildcards.subset,
        workers=sm.threads,
    )
