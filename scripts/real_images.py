"""Snakemake entry point: the reference pool or the held-out real images."""

from distrank._io import logged
from distrank.data.fashion_mnist import load_fashion_mnist
from distrank.data.images import save_images
from distrank.data.subsets import per_class_subset

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    data, subset = sm.params.data, sm.wildcards.subset
    split = {"reference": "train", "heldout": "test"}[subset]
    images, labels = load_fashion_mnist(split, root=data["root"])
    rows = per_class_subset(labels, data[f"{subset}_per_class"], seed=sm.params.seed)
    save_images(sm.output[0], images[rows, :, :, None], labels[rows],
                source=f"fashion_mnist/{split}", rows=rows.tolist())
