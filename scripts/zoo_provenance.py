"""Snakemake entry point: the provenance record of a trained zoo state."""

import pandas as pd

from distrank import zoo
from distrank._io import logged, write_json
from distrank.data.images import load_images
from distrank.zoo.pretrained import provenance

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    record = provenance(
        sm.input.state,
        zoo.load_state(sm.input.state),
        settings=sm.params.settings,
        seed=sm.params.seed,
        threads=sm.params.threads,
        images={**sm.params.images, "count": len(load_images(sm.input.images)[0])},
        wall_s=float(pd.read_csv(sm.input.benchmark, sep="\t")["s"].iloc[-1]),
    )
    write_json(sm.output[0], record)
