"""A site's node config (``flower-supernode --node-config``, TOML values), checked.

    site-id         int or str, required: the client name in the table (reported, so
                    results do not depend on Flower's random node ids)
    features        str, required: npz file with ``features`` (n_i, d), the site's
                    reference features (read without pickle)
    share-stats     bool, default false: allow replying with the Gaussian statistics
                    (and, in secure mode, adding the moments to the secure sum)
    device          str, default "": torch device ("" is CUDA when available, else CPU)
    secure-only     bool, default true: refuse plain queries, so that the site's scores
                    and statistics leave it only inside secure sums
    min-sites       int, default 3: the fewest sites a secure sum this site enters may cover

Secure mode (each checked before the site reads its data, so that no refusal depends
on it; the site's data must meet its own bounds):

    signing-key     str: the site's Ed25519 private key, PEM (:mod:`~distrank.flower.identity`)
    peers           str: JSON file of every member's public key, by site id
    feature-bound   float: a bound on the L2 norm of this site's rows; a plan with a
                    smaller ``feature-bound`` is refused
    max-rows        int, default 1000000: a bound on this site's rows; likewise
    min-rows        int, default 2: the rows this site has at least (public); a request
                    that needs more rows per site is refused
    noise-epsilon   float, default 0: > 0, the (epsilon, delta) each release must meet:
    noise-delta     float              a plan with less noise is refused
    budget-epsilon  float, default 0: > 0, the epsilon (at ``noise-delta``) of every
    ledger          str                release composed, recorded in ``ledger``; a run
                                       past it (or without noise) is refused

Other keys are left to other apps the same SuperNode may run.
"""

from __future__ import annotations

import math
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
    secure_only: bool = True
    min_sites: int = 3
    signing_key: Path | None = None
    peers: Path | None = None
    feature_bound: float = 0.0
    max_rows: int = 1000000
    min_rows: int = 2
    noise_epsilon: float = 0.0
    noise_delta: float = 0.0
    budget_epsilon: float = 0.0
    ledger: Path | None = None

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
        device = config.get("device", "")
        if not isinstance(device, str):
            raise ValueError(f"node config: 'device' must be a str, got {device!r}")
        out = cls(
            site,
            Path(features),
            _flag(config, "share-stats", False),
            device or None,
            _flag(config, "secure-only", True),
            _int(config, "min-sites", 3, 2),
            _path(config, "signing-key"),
            _path(config, "peers"),
            _float(config, "feature-bound"),
            _int(config, "max-rows", 1000000, 2),
            _int(config, "min-rows", 2, 1),
            _float(config, "noise-epsilon"),
            _float(config, "noise-delta"),
            _float(config, "budget-epsilon"),
            _path(config, "ledger"),
        )
        if (out.noise_epsilon or out.budget_epsilon) and not 0 < out.noise_delta < 1:
            raise ValueError("node config: 'noise-delta' must be in (0, 1) with a noise budget")
        if out.budget_epsilon and out.ledger is None:
            raise ValueError("node config: 'budget-epsilon' needs a 'ledger' file")
        return out


def _flag(config: Mapping, key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"node config: {key!r} must be true or false, got {value!r}")
    return value


def _int(config: Mapping, key: str, default: int, least: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"node config: {key!r} must be an int >= {least}, got {value!r}")
    return value


def _float(config: Mapping, key: str) -> float:
    value = config.get(key, 0.0)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ValueError(f"node config: {key!r} must be a number >= 0, got {value!r}")
    return float(value)


def _path(config: Mapping, key: str) -> Path | None:
    value = config.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"node config: {key!r} must be a path, got {value!r}")
    return Path(value) if value else None
