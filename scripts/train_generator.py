"""Snakemake entry point: train a generator of the zoo on the reference pool."""

from distrank import zoo
from distrank._io import logged
from distrank.data.images import load_images

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    images, labels = load_images(sm.input[0])
    state = zoo.train(
        sm.params.family,
        images[..., 0],
        labels,
        seed=sm.params.seed,
        threads=sm.threads,
        **sm.params.settings,
    )
    zoo.save_state(sm.output[0], state)
