"""Snakemake entry point: the provenance record of a trained zoo state."""

from distrank._io import logged, write_json
from distrank.zoo.pretrained import job_provenance

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    record = job_provenance(
        sm.input.state,
        sm.input.images,
        sm.input.benchmark,
        settings=sm.params.settings,
        seed=sm.params.seed,
        threads=sm.params.threads,
        images=sm.params.images,
    )
    write_json(sm.output[0], record)
