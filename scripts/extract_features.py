"""Snakemake entry point: features of one image set, with their metadata beside them."""

from distrank._io import logged
from distrank.features import extractor_from_config
from distrank.features.cache import extract_to_file

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    cfg = sm.params.features
    extractor = extractor_from_config(cfg, device=sm.params.device, threads=sm.threads)
    extract_to_file(sm.input[0], sm.output[0], extractor, batch_size=cfg["batch_size"])
