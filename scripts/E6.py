"""Snakemake entry point: E6, Precision, Recall, Density and Coverage, all vs avg."""

from distrank._io import logged
from distrank.federation import collect
from distrank.report.figures import save
from distrank.report.tables import write_table
from distrank.study.e6 import e6_figure, e6_table

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    per_model, agreement = e6_table(collect(sm.input.avg, sm.input.all))
    write_table(per_model, sm.output.tables[0].removesuffix(".csv"))
    write_table(agreement, sm.output.agreement[0].removesuffix(".csv"))
    save(e6_figure(per_model, sm.params.extractor), sm.output.pdf.removesuffix(".pdf"))
