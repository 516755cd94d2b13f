"""Feature extraction: named extractors (uint8 images -> float32 features) and a metadata-checked cache.

>>> from distrank.features import get_extractor
>>> ex = get_extractor("efficientnet_lite0", backend="onnx")   # doctest: +SKIP
>>> feats = ex.extract(images_uint8_nhwc, batch_size=64)         # doctest: +SKIP

Heavy imports (torch, onnxruntime, timm, torch-fidelity) happen when an
extractor is built, not on ``import distrank.features``.
"""

from __future__ import annotations

from distrank._lazy import lazy_getattr, lazy_names

_EXPORTS = {  # submodule -> the names it defines
    "base": (
        "Extractor",
        "available_extractors",
        "get_extractor",
        "extractor_from_config",
        "register_extractor",
    ),
    "cache": ("cached_features", "extract_to_file"),
}

__all__ = lazy_names(_EXPORTS)

# PEP 562: keep `import distrank.features` cheap
__getattr__ = lazy_getattr(__name__, _EXPORTS)
