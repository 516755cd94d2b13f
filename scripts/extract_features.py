"""Snakemake entry point: features of one image set, with their metadata beside them."""

from distrank._io import logged
from distrank.features import get_extractor
from distrank.features.cache import extract_to_file

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0]):
    cfg = sm.params.features
    options = {"num_threads": sm.threads} if cfg["backend"] == "onnx" else {}
    extractor = get_extractor(cfg["extractor"], backend=cfg["backend"], device=sm.params.device,
                              cache_dir=cfg["weights_dir"], **options)
    extract_to_file(sm.input[0], sm.output[0], extractor, batch_size=cfg["batch_size"])
