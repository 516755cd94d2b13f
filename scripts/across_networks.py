"""Snakemake entry point: two studies' E1 and E6 rankings compared across their networks."""

from distrank._io import logged
from distrank.experiments.e1_kd_consistency import across_networks, read_per_model
from distrank.tables import write_table

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    table = across_networks(
        read_per_model(sm.input.default), read_per_model(sm.input.study), sm.params.extractors
    )
    write_table(table, sm.output[0].removesuffix(".csv"))
