"""Snakemake entry point: assign every reference row to a client (or to none)."""

import numpy as np

from distrank._io import logged
from distrank.clients import partition, save_manifest

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]), np.load(sm.input[0], allow_pickle=False) as ref:
    labels = ref["labels"] if "labels" in ref.files else None  # e.g. FFHQ: kmeans only
    owner = partition(
        labels, scheme=sm.params.scheme, seed=sm.params.seed, features=ref["features"]
    )
    save_manifest(sm.output[0], owner, scheme=dict(sm.params.scheme), seed=sm.params.seed)
