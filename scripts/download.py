"""Snakemake entry point: one artifact of the config's downloads, verified, then renamed
into place (the lock file holds the sha256 where none is published)."""

from distrank._io import logged
from distrank.data.download import fetch

sm = snakemake  # noqa: F821  (injected by Snakemake)
with logged(sm.log[0], cost=sm.log.get("cost")):
    entry = sm.params.entry
    fetch(
        entry["url"],
        sm.output[0],
        sha256=entry["sha256"],
        md5=entry["md5"],
        size=entry["size"],
        lockfile=sm.params.lockfile,
        allow_http=sm.config["downloads_allow_http"],
    )
