"""Snakemake entry point, run at a client: every model on this client's features only."""

from distrank._io import logged
from distrank.metrics._registry import load_plugins
from distrank.metrics._score_files import score_client_file

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    load_plugins(sm.config["plugins"])  # the config's own metrics, registered
    score_client_file(
        sm.input.client,
        dict(zip(sm.params.models, sm.input.models)),
        sm.output[0],
        client=sm.wildcards.client,
        options=sm.params.metrics,
    )
