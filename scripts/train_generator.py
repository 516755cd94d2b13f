"""Snakemake entry point: train a generator of the zoo on the reference pool, and
write its provenance beside it."""

import time

from distrank import zoo
from distrank._io import logged, write_json
from distrank.data.images import load_images
from distrank.zoo.pretrained import provenance

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    images, labels = load_images(sm.input[0])
    start = time.perf_counter()
    state = zoo.train(
        sm.params.family,
        images[..., 0],
        labels,
        seed=sm.params.seed,
        threads=sm.threads,
        **sm.params.settings,
    )
    wall_s = time.perf_counter() - start
    zoo.save_state(sm.output.state, state)
    record = provenance(
        sm.output.state,
        state,
        settings=sm.params.settings,
        seed=sm.params.seed,
        threads=sm.threads,
        images={**sm.params.images, "count": len(images)},
        wall_s=wall_s,
    )
    write_json(sm.output.provenance, record)
