"""Snakemake entry point, centralized: E10's bootstrap intervals need the pooled reference."""

from distrank._io import logged
from distrank.experiments.e10_intervals import write_bootstrap_tables

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    settings = sm.params.settings
    write_bootstrap_tables(
        sm.input.reference,
        sm.input.manifest,
        dict(zip(sm.params.models, sm.input.models)),
        sm.output.pairs,
        sm.output.tau,
        metrics=settings["metrics"],
        n_resamples=settings["n_resamples"],
        confidence_level=settings["confidence_level"],
        seed=sm.params.seed,
        metrics_config=sm.params.metrics,
        device=sm.params.device,
        threads=sm.threads,
    )
