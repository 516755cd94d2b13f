"""Snakemake entry point, centralized: E2's G1 (the base model's features, restricted
to the clients' classes when both are known) and G2 (Proposition 1's construction
from the clients' Gaussian statistics)."""

import numpy as np

from distrank._io import atomic_path, logged
from distrank.federation import load_features
from distrank.study.e2 import construct_g2

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    parts = [load_features(p) for p in sm.input.clients]
    reference = np.concatenate(parts)
    clients = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    with np.load(sm.input.base, allow_pickle=False) as base:
        g1 = base["features"]
        if sm.params.classes is not None and "labels" in base.files:
            g1 = g1[np.isin(base["labels"], sm.params.classes)]
    g2 = construct_g2(reference, clients, g1, random_state=sm.params.seed)
    for path, feats in ((sm.output.g1, g1), (sm.output.g2, g2)):
        with atomic_path(path) as tmp:
            np.savez(tmp, features=feats)
