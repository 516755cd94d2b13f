"""Feature extraction: named extractors (uint8 images -> float32 features) and a metadata-checked cache.

>>> from distrank.features import get_extractor
>>> ex = get_extractor("efficientnet_lite0", backend="onnx")   # doctest: +SKIP
>>> feats = ex.extract(images_uint8_nhwc, batch_size=64)         # doctest: +SKIP

Heavy imports (torch, onnxruntime, timm, torch-fidelity) happen when an
extractor is built, not on ``import distrank.features``.
"""

from __future__ import annotations

__all__ = [
    "Extractor",
    "available_extractors",
    "cached_features",
    "extract_to_file",
    "get_extractor",
    "extractor_from_config",
    "register_extractor",
]


def __getattr__(name):  # PEP 562: keep `import distrank.features` cheap
    if name in (
        "Extractor",
        "available_extractors",
        "get_extractor",
        "extractor_from_config",
        "register_extractor",
    ):
        from . import base

        return getattr(base, name)
    if name in ("cached_features", "extract_to_file"):
        from . import cache

        return getattr(cache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
