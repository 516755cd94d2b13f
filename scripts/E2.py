"""Snakemake entry point: E2, Proposition 1 (same FD_avg, different FD_all)."""

from distrank._io import logged
from distrank.federation import collect
from distrank.report.figures import save
from distrank.report.tables import write_table
from distrank.study.e2 import e2_figure, e2_table

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    table = e2_table(collect(sm.input.avg, sm.input.all), g1="e2-G1", g2="e2-G2")
    write_table(table, sm.output.tables[0].removesuffix(".csv"))
    save(e2_figure(table, sm.params.extractor), sm.output.pdf.removesuffix(".pdf"))
