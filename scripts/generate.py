"""Snakemake entry point: one model's images (generated, degraded, or held-out real)."""

from distrank import zoo
from distrank._io import logged
from distrank.data.images import load_images, save_images
from distrank.zoo.degrade import degrade

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    spec = dict(sm.params.spec)
    kind = spec.pop("kind")
    if kind in zoo.FAMILIES:
        state = zoo.load_state(sm.input.state)
        images, labels = zoo.sample(state, sm.params.n_samples, seed=sm.params.seed, **spec)
    else:
        images, labels = load_images(sm.input.heldout)
        if kind != "heldout":
            (level,) = spec.values()
            images, labels = degrade(kind, images, labels, level=level, seed=sm.params.seed)
    save_images(sm.output[0], images, labels, model=sm.wildcards.model, spec=dict(sm.params.spec))
