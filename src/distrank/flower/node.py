"""A site's node config (``flower-supernode --node-config``, TOML values), checked.

    site-id      int or str, required: the client name in the table (reported, so
                 results do not depend on Flower's random node ids)
    features     str, required: npz file with ``features`` (n_i, d), the site's
                 reference features (read without pickle)
    share-stats  bool, default false: allow replying with the Gaussian statistics
                 (and, in secure mode, adding the moments to the secure sum)
    device       str, default "": torch device ("" is CUDA when available, else CPU)
    secure-only  bool, default false: refuse plain queries, so that the site's scores
                 and statistics leave it only inside secure sums
    min-sites    int, default 3: the fewest sites a secure sum this site enters may cover

Other keys are left to other apps the same SuperNode may run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SiteConfig:
    """A site's node config, checked."""

    site: int | str
    features: Path
    share_stats: bool = False
    device: str | None = None
    secure_only: bool = False
    min_sites: int = 3

    @classmethod
    def from_node_config(cls, config: Mapping) -> SiteConfig:
        site = config.get("site-id")
        if isinstance(site, bool) or not isinstance(site, (int, str)) or site == "":
            raise ValueError(
                f"node config: 'site-id' must be an int or a non-empty str, got {site!r}"
            )
        features = config.get("features")
        if not isinstance(features, str) or not features:
            raise ValueError(
                f"node config: 'features' must be the path of an npz file, got {features!r}"
            )
        share, secure_only = (_flag(config, key) for key in ("share-stats", "secure-only"))
        device = config.get("device", "")
        if not isinstance(device, str):
            raise ValueError(f"node config: 'device' must be a str, got {device!r}")
        min_sites = config.get("min-sites", 3)
        if isinstance(min_sites, bool) or not isinstance(min_sites, int) or min_sites < 2:
            raise ValueError(f"node config: 'min-sites' must be an int >= 2, got {min_sites!r}")
        return cls(site, Path(features), share, device or None, secure_only, min_sites)


def _flag(config: Mapping, key: str) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"node config: {key!r} must be true or false, got {value!r}")
    return value
