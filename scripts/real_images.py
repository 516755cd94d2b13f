"""Snakemake entry point: the reference pool or the held-out real images, a seeded
subset of a source: `per_class` images of each class, or `n` at random."""

from distrank._io import logged
from distrank.data.images import save_images
from distrank.data.sources import load_source
from distrank.data.subsets import draw_subset

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    spec, subset = sm.params.spec, sm.wildcards.subset
    image_set = load_source(spec["source"], paths=sm.params.paths, workers=sm.threads)
    images, labels = image_set
    rows = draw_subset(labels, len(images), spec, seed=sm.params.seed, where=subset)
    names = image_set.label_names
    save_images(
        sm.output[0],
        images[rows],
        None if labels is None else labels[rows],
        source=dict(spec["source"]),
        rows=rows.tolist(),
        label_names=None if names is None else list(names),
    )
