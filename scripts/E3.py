"""Snakemake entry point: E3, Theorem 2 on Gaussians (closed form, no data)."""

import numpy as np

from distrank._io import logged
from distrank.report.figures import save
from distrank.report.tables import write_table
from distrank.study.e3 import e3_curves, e3_figure, e3_table, ring_clients

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    s = sm.params.settings
    t = np.round(np.linspace(s["t_min"], s["t_max"], s["n_points"]), 10)
    curves = e3_curves(ring_clients(s["n_clients"], s["dim"]), t, bandwidth=s["bandwidth"])
    write_table(e3_table(curves), sm.output.tables[0].removesuffix(".csv"))
    write_table(curves, sm.output.curves[0].removesuffix(".csv"))
    save(e3_figure(curves), sm.output.pdf.removesuffix(".pdf"))
