"""Snakemake entry point: a shipped generator checkpoint, verified against its sha256."""

from distrank._io import logged
from distrank.zoo.pretrained import install

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    install(sm.input[0], sm.params.sha256, sm.output[0])
