"""Snakemake entry point: one model's images (generated, degraded, or held-out real)."""

from distrank import zoo
from distrank._io import logged
from distrank.data.images import load_images, save_images
from distrank.zoo.degrade import degrade

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    spec, n, seed = dict(sm.params.spec), sm.params.n_samples, sm.params.seed
    kind = spec.pop("kind")
    if kind in zoo.FAMILIES:
        images, labels = zoo.sample(zoo.load_state(sm.input.state), n, seed=seed, **spec)
    else:
        images, labels = load_images(sm.input.heldout)
        if kind != "real":
            (level,) = spec.values()
            images, labels = degrade(kind, images[..., 0], labels, level=level, seed=seed)
    save_images(sm.output[0], images, labels, model=sm.wildcards.model, spec=sm.params.spec)
