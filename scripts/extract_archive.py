"""Snakemake entry point: unpack a downloaded archive, refusing members that would land
outside the target folder."""

from distrank._io import logged
from distrank.data.archive import safe_extract

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    safe_extract(sm.input[0], sm.output[0])
