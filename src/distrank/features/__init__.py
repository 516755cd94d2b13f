"""Feature extraction: named extractors (uint8 images -> float32 features) and a metadata-checked cache.

>>> from distrank.features import get_extractor
>>> ex = get_extractor("efficientnet_lite0", backend="onnx")   # doctest: +SKIP
>>> feats = ex.extract(images_uint8_nhwc, batch_size=64)         # doctest: +SKIP

Heavy imports (torch, onnxruntime, timm, torch-fidelity) happen when an
extractor is built, not on ``import distrank.features``.
"""

from __future__ import annotations

from distrank._lazy import lazy_getattr

_EXPORTS = {
    "Extractor": "base",
    "available_extractors": "base",
    "get_extractor": "base",
    "extractor_from_config": "base",
    "register_extractor": "base",
    "cached_features": "cache",
    "extract_to_file": "cache",
}

__all__ = list(_EXPORTS)

# PEP 562: keep `import distrank.features` cheap
__getattr__ = lazy_getattr(__name__, _EXPORTS)
