"""Snakemake entry point: E1, KD consistency across the model zoo."""

from distrank._io import logged
from distrank.federation import collect
from distrank.report.figures import save
from distrank.report.tables import write_table
from distrank.study.e1 import e1_figure, e1_table

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    per_model, agreement = e1_table(collect(sm.input.avg, sm.input.all))
    write_table(per_model, sm.output.tables[0].removesuffix(".csv"))
    write_table(agreement, sm.output.agreement[0].removesuffix(".csv"))
    save(e1_figure(per_model, sm.params.extractor), sm.output.pdf.removesuffix(".pdf"))
