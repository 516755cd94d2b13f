"""Snakemake entry point, run at the server: D_avg from the clients' score files."""

from distrank._io import logged
from distrank.metrics._registry import load_plugins
from distrank.metrics._score_files import average_client_files

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    load_plugins(sm.config["plugins"])  # the config's own metrics, registered
    average_client_files(sm.input, sm.output[0], weights=sm.params.weights)
