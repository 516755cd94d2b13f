"""Snakemake entry point of every experiment: the rule's name is the experiment's key."""

from distrank import experiments
from distrank._io import logged

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    exp = experiments.get(sm.rule)
    out = exp.run(dict(sm.input.items()), sm.params.settings, sm.params.context)
    exp.write(out, dict(sm.output.items()))
