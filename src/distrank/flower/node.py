"""A site's node config (``flower-supernode --node-config``, TOML values), checked.

    site-id         int or str, required: the client name in the table (reported, so
                    results do not depend on Flower's random node ids)
    features        str, required: npz file with ``features`` (n_i, d), the site's
                    reference features (read without pickle)
    device          str, default "": torch device ("" is CUDA when available, else CPU)
    signing-key     str: the site's Ed25519 private key, PEM (:mod:`~distrank.flower.identity`);
                    secure mode needs it, and with it the site signs what it attests
    peers           str: JSON file of every member's public key, by site id

and the site's release policy (:mod:`distrank.flower.policy`): its keys here, or a
``policy`` file that holds them. Other keys are left to other apps the same SuperNode
may run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from distrank.flower.policy import POLICY_KEYS, Policy, load

#: keys of older releases, and what replaced them
REPLACED = {
    "secure-only": '\'plain\' ("" answers secure requests only; "scores", "sketch" open '
    "those plain answers, each on its own)",
}


@dataclass(frozen=True)
class SiteConfig:
    """A site's node config, checked: who it is, its data, and its release policy."""

    site: int | str
    features: Path
    policy: Policy = field(default_factory=Policy)
    device: str | None = None
    signing_key: Path | None = None
    peers: Path | None = None

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
        for key, now in REPLACED.items():
            if key in config:
                raise ValueError(f"node config: {key!r} is replaced by {now}")
        return cls(
            site,
            Path(features),
            load(config),
            device or None,
            _path(config, "signing-key"),
            _path(config, "peers"),
        )


def _path(config: Mapping, key: str) -> Path | None:
    value = config.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"node config: {key!r} must be a path, got {value!r}")
    return Path(value) if value else None


__all__ = ["POLICY_KEYS", "SiteConfig"]
