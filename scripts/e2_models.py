"""Snakemake entry point, centralized: E2's G1 and G2 in feature space."""

from distrank._io import logged
from distrank.experiments.e2_fd_counterexample import write_models

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    write_models(
        sm.input.clients,
        sm.input.base,
        sm.output.g1,
        sm.output.g2,
        classes=sm.params.classes,
        seed=sm.params.seed,
    )
