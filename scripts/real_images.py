"""Snakemake entry point: the reference pool or the held-out real images."""

from distrank._io import logged
from distrank.data.images import save_images
from distrank.data.sources import load_source
from distrank.data.subsets import per_class_subset

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    spec = sm.params.spec
    images, labels = load_source(spec["source"])
    rows = per_class_subset(labels, spec["per_class"], seed=sm.params.seed)
    save_images(sm.output[0], images[rows], labels[rows], source=dict(spec["source"]),
                rows=rows.tolist())
