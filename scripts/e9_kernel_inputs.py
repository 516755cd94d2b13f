"""Snakemake entry point, centralized: E9's exact client and pooled KD at every client size."""

from distrank._io import logged
from distrank.experiments.e9_private_ranking import write_kernel_inputs

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    settings = sm.params.settings
    write_kernel_inputs(
        sm.input.reference,
        sm.input.manifest,
        dict(zip(sm.params.models, sm.input.models)),
        sm.output[0],
        sizes=settings["client_sizes"],
        kernel=settings["kernel"],
        bandwidth_from=settings["bandwidth_from"],
        estimator=sm.params.metrics["kd_estimator"],
        seed=sm.params.seed,
        dtype=sm.params.metrics["dtype"],
        device=sm.params.device,
        threads=sm.threads,
    )
