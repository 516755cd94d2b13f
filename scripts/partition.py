"""Snakemake entry point: assign every reference row to a client (or to none)."""

from distrank._io import logged
from distrank.clients import partition, save_manifest
from distrank.features.cache import load_labelled

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    features, labels = load_labelled(sm.input[0])  # labels None (e.g. FFHQ): kmeans only
    owner = partition(labels, scheme=sm.params.scheme, seed=sm.params.seed, features=features)
    save_manifest(sm.output[0], owner, scheme=dict(sm.params.scheme), seed=sm.params.seed)
