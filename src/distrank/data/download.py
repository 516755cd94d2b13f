"""Verified downloads: stream to ``<dest>.part``, check size and checksum, rename.

A file is only ever visible under its final name once its size and checksum
have been verified, so a crashed or interrupted run can never leave a
corrupt ``dest`` behind. Interrupted transfers resume from the ``.part`` file
with an HTTP ``Range`` request when the server honours it
(:mod:`distrank.data.transfer`, which also refuses plain http without an opt-in).

Every download is checked against something (:mod:`distrank.data.checksums`): a
published checksum (``sha256`` or ``md5``) or, when none is published, the sha256
recorded on first download in a lock file (``resources/checksums.lock``) that the
user commits. Asking for a download with neither is an error, never a silent skip.
A GitHub code archive is identified by its commit and git tree, its sha256 second
(:func:`distrank.data.checksums.archive_identity`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .checksums import (
    ChecksumError,
    _check_commit,
    _code_archive_problem,
    _expectations,
    _record_in_lockfile,
    _update_lock_entry,
    archive_identity,
    code_archive_commit,
    read_lockfile,
)
from .transfer import _check_scheme, _download_with_retries

__all__ = ["fetch"]

log = logging.getLogger(__name__)


def fetch(
    url: str,
    dest: str | os.PathLike,
    *,
    sha256: str | None = None,
    md5: str | None = None,
    size: int | None = None,
    lockfile: str | os.PathLike | None = None,
    retries: int = 3,
    timeout: float = 60,
    chunk: int = 1 << 20,
    backoff: float = 2.0,
    allow_http: bool = False,
) -> Path:
    """Download ``url`` to ``dest`` and verify it; return ``dest`` as a Path.

    If ``dest`` already verifies, nothing is downloaded. On a size or checksum mismatch
    the file is deleted and :class:`~distrank.data.checksums.ChecksumError` names the
    URL, the file, and the expected and actual values. A GitHub code archive checked by
    the lock file is identified by commit and tree, its sha256 second (module doc).

    Parameters
    ----------
    url : str
        The source: an https or file URL, or http with ``allow_http``.
    dest : str or os.PathLike
        Final path; the transfer goes to ``<dest>.part``, renamed once verified.
    sha256, md5 : str, optional
        Published checksums (hex); every one given is checked.
    size : int, optional
        Expected size in bytes, checked when given.
    lockfile : str or os.PathLike, optional
        JSON file mapping url -> {"sha256", "size"}, used when no checksum is given:
        the first download records them, later calls verify against the record.
    retries : int
        Extra attempts after the first, for network errors, truncated responses and
        transient HTTP statuses (5xx, 408, 429), the first after ``backoff`` seconds,
        doubled on each further one; ``timeout`` (s) per attempt, read ``chunk`` bytes.
    timeout : float
        Seconds per attempt (default 60).
    chunk : int
        Bytes read at a time (default 1 MiB).
    backoff : float
        Seconds before the first retry (default 2), doubled on each further one.
    allow_http : bool
        Accept a plain http ``url`` (a trusted mirror); a redirect keeps the scheme.

    Returns
    -------
    pathlib.Path
        ``dest``, verified.

    Raises
    ------
    ChecksumError
        The file does not verify (it is deleted).
    DownloadError
        The transfer failed after all retries, or with a permanent HTTP status.
    ValueError
        No verification given (no checksum and no ``lockfile``), or a refused scheme.
    """
    dest = Path(dest)
    _check_scheme(url, allow_http=allow_http)
    commit = code_archive_commit(url)
    if commit is not None and sha256 is None and md5 is None and lockfile is not None:
        transfer = {"retries": retries, "timeout": timeout, "chunk": chunk, "backoff": backoff}
        return _fetch_code_archive(
            url, dest, commit, size=size, lockfile=lockfile, allow_http=allow_http, **transfer
        )
    expected, record_in_lock = _expectations(url, sha256, md5, size, lockfile)
    size = expected.size
    if dest.exists():
        problem = expected.problem(dest)
        if problem is None:
            if record_in_lock:
                # Trust on first use also covers a file the user put there by hand.
                _record_in_lockfile(lockfile, url, dest)
            return dest
        log.warning("%s exists but does not verify (%s); downloading it again", dest, problem)
        dest.unlink()

    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    log.info("downloading %s to %s", url, dest)
    _download_with_retries(
        url, part, size=size, retries=retries, timeout=timeout, chunk=chunk, backoff=backoff
    )
    problem = expected.problem(part)
    if problem is not None:
        part.unlink(missing_ok=True)
        raise ChecksumError(
            f"download of {url} to {dest} failed verification: {problem}; "
            "the bad file was deleted" + expected.lock_hint()
        )
    if commit is not None:
        _check_commit(url, part, archive_identity(part), commit)
    os.replace(part, dest)
    if record_in_lock:
        _record_in_lockfile(lockfile, url, dest)
    return dest


def _fetch_code_archive(
    url, dest, commit, *, size, lockfile, retries, timeout, chunk, backoff, allow_http
):
    """fetch() of a GitHub code archive checked by the lock file: commit, then tree,
    then (secondary) sha256."""
    entry = read_lockfile(lockfile).get(url)
    if entry is not None and "tree" not in entry:
        # Recorded before trees were: the bytes must match once, then the tree is added.
        fetch(
            url,
            dest,
            sha256=entry["sha256"],
            size=entry.get("size"),
            retries=retries,
            timeout=timeout,
            chunk=chunk,
            backoff=backoff,
            allow_http=allow_http,
        )
        identity = archive_identity(dest)
        _check_commit(url, dest, identity, commit)
        _update_lock_entry(lockfile, url, dest, identity)
        return dest
    if dest.exists():
        problem = _code_archive_problem(dest, commit, entry)
        if problem is None:
            _update_lock_entry(lockfile, url, dest, archive_identity(dest))
            return dest
        log.warning("%s exists but does not verify (%s); downloading it again", dest, problem)
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    part.unlink(missing_ok=True)  # GitHub's bytes may differ between requests: no resuming
    log.info("downloading %s to %s", url, dest)
    _download_with_retries(
        url, part, size=size, retries=retries, timeout=timeout, chunk=chunk, backoff=backoff
    )
    if size is not None and part.stat().st_size != size:
        got = part.stat().st_size
        part.unlink()
        raise ChecksumError(f"download of {url}: size: expected {size} bytes, got {got}")
    problem = _code_archive_problem(part, commit, entry)
    if problem is not None:
        part.unlink(missing_ok=True)
        raise ChecksumError(
            f"download of {url} to {dest} failed verification: {problem}; the bad file was "
            f"deleted. The tree was recorded in {lockfile} on first download; if the code "
            "legitimately changed (it cannot for one commit), delete its entry there"
        )
    os.replace(part, dest)
    _update_lock_entry(lockfile, url, dest, archive_identity(dest))
    return dest
