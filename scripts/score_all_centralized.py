"""Snakemake entry point, centralized: D_all needs the pooled reference features."""

from distrank._io import logged
from distrank.metrics._registry import load_plugins
from distrank.metrics._score_files import score_centralized_file

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    load_plugins(sm.config["plugins"])  # the config's own metrics, registered
    score_centralized_file(
        sm.input.reference,
        sm.input.manifest,
        dict(zip(sm.params.models, sm.input.models)),
        sm.output[0],
        options=sm.params.metrics,
    )
