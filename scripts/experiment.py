"""Snakemake entry point of every experiment and of its pre-steps: the rule's name says
which (distrank.experiments.run_rule)."""

from distrank import experiments
from distrank._io import logged
from distrank.metrics._registry import load_plugins

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    load_plugins(sm.config["plugins"])  # the config's own metrics, registered
    job = experiments.Job(
        dict(sm.input.items()),
        dict(sm.output.items()),
        dict(sm.params.items()),
        dict(sm.wildcards.items()),
        sm.threads,
    )
    experiments.run_rule(sm.rule, job)
