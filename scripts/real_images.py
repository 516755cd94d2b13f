"""Snakemake entry point: the reference pool or the held-out real images, a seeded
subset of a source: `per_class` images of each class, or `n` at random."""

import numpy as np

from distrank._io import logged
from distrank.data.images import save_images
from distrank.data.sources import load_source
from distrank.data.subsets import per_class_subset

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    spec, subset = sm.params.spec, sm.wildcards.subset
    image_set = load_source(spec["source"], paths=sm.params.paths, workers=sm.threads)
    images, labels = image_set
    if "per_class" in spec:
        if labels is None:
            raise ValueError(f"{subset}.per_class needs class labels, but {subset}.source has "
                             "none; draw n images instead")
        rows = per_class_subset(labels, spec["per_class"], seed=sm.params.seed)
    else:
        if spec["n"] > len(images):
            raise ValueError(f"{subset}.n is {spec['n']}, but {subset}.source has only "
                             f"{len(images)} images")
        rng = np.random.default_rng(sm.params.seed)
        rows = np.sort(rng.choice(len(images), spec["n"], replace=False))
    names = image_set.label_names
    save_images(sm.output[0], images[rows], None if labels is None else labels[rows],
                source=dict(spec["source"]), rows=rows.tolist(),
                label_names=None if names is None else list(names))
