"""Snakemake entry point of the agreement study: one family (A1-A6) per job."""

from threadpoolctl import threadpool_limits

from distrank._io import logged
from distrank.agreement.study import run_family, write_family

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")), threadpool_limits(limits=sm.threads):
    pairs, summary, fig = run_family(sm.params.family, sm.params.settings, seed=sm.params.seed)
    results, figures = sm.output.tables[0].rsplit("/", 1)[0], sm.output.pdf.rsplit("/", 1)[0]
    write_family(sm.params.family, pairs, summary, fig, results=results, figures=figures)
