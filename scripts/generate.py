"""Snakemake entry point: one model's images (sampled from the zoo or a published
checkpoint, read from a source, degraded, or held-out real)."""

from distrank import zoo
from distrank._io import logged
from distrank.data.images import save_images

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    images, labels = zoo.make_images(
        sm.params.spec,
        sm.params.n_samples,
        seed=sm.params.seed,
        inputs=dict(sm.input.items()),
        paths=sm.params.paths,
        batch_size=sm.params.batch_size,
        device=sm.params.device,
        trust_pickles=sm.params.trust_pickles,
        workers=sm.threads,
        name=sm.wildcards.model,
    )
    save_images(sm.output[0], images, labels, model=sm.wildcards.model, spec=dict(sm.params.spec))
