"""Snakemake entry point of the rule ``cost`` (distrank.experiments.cost)."""

from distrank._io import logged
from distrank.experiments import cost

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    found = cost.study_cost(list(sm.input), sm.params["patterns"])
    cost.write(found, sm.output["md"], sm.output["csv"], sm.params["study"])
    print(f"{len(found.benchmarked)} jobs: {found.wall:.0f} wall-s, {found.cpu:.0f} CPU-s")
