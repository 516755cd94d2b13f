"""Snakemake entry point: the features one client holds (stands in for its own data)."""

import numpy as np

from distrank._io import atomic_path, logged
from distrank.clients import client_features

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")), atomic_path(sm.output[0]) as tmp:
    client = int(sm.wildcards.client.removeprefix("c"))
    np.savez(tmp, features=client_features(sm.input.features, sm.input.manifest, client))
