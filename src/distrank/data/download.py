"""Verified downloads: stream to ``<dest>.part``, check size and checksum, rename.

A file is only ever visible under its final name once its size and checksum
have been verified, so a crashed or interrupted run can never leave a
corrupt ``dest`` behind. Interrupted transfers resume from the ``.part`` file
with an HTTP ``Range`` request when the server honours it.

Every download is checked against something: a published checksum (``sha256``
or ``md5``) or, when none is published, the sha256 recorded on first download
in a lock file (``resources/checksums.lock``) that the user commits. Asking for
a download with neither is an error, never a silent skip.

Downloads go over https (or read a local ``file://`` URL). Plain http, whose bytes
anyone on the path can swap (only the checksum would notice), is refused unless
the caller opts in with ``allow_http=True`` (config ``downloads_allow_http: true``,
for a trusted local mirror); a redirect that changes the scheme (https to http,
say) is refused either way.

A GitHub code archive (``.../archive/<40-hex commit>.tar.gz``) is identified by
what it holds, not by its bytes, which GitHub has changed before (it generates
archives on demand and once switched their compression): the commit id in the
tar's pax header (``git archive`` writes it) must be the URL's, and the git tree id
computed from the members (:func:`archive_identity`; for an archive without
export-ignored files it equals ``git rev-parse <commit>^{tree}``) is recorded in
the lock file beside the sha256. Later downloads must match the tree; the sha256
is a secondary check: a mismatch with the same commit and tree is logged and the
new bytes recorded.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import stat
import tarfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from distrank._io import atomic_open, file_digest

try:  # POSIX only; without it concurrent lock-file updates are not serialised.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = [
    "ArchiveIdentity",
    "ChecksumError",
    "archive_identity",
    "code_archive_commit",
    "DownloadError",
    "fetch",
    "read_lockfile",
]

log = logging.getLogger(__name__)

USER_AGENT = "distrank-fetch/0.1 (+python-urllib)"
# Statuses worth another try: the server or a proxy is temporarily unhappy.
TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# URL schemes fetched without an opt-in (plain http needs allow_http=True).
SCHEMES = ("https", "file")


class DownloadError(RuntimeError):
    """The file could not be downloaded (after all retries)."""


class ChecksumError(DownloadError):
    """A downloaded (or existing) file does not match its expected size or checksum."""


class _Transient(Exception):
    """Internal: an attempt failed in a way that another attempt may fix."""


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

    Parameters
    ----------
    url : the source: an https or file URL, or http with ``allow_http``.
    dest : final path; the transfer goes to ``<dest>.part`` and is renamed
        atomically (``os.replace``) once verified.
    sha256, md5 : published checksums (hex); every one given is checked.
    size : expected size in bytes, checked when given.
    lockfile : JSON file mapping url -> {"sha256", "size"}. Used only when no
        checksum is given: the first download records its sha256 and size
        there, later calls verify against the record.
    retries : extra attempts after the first, for network errors, truncated
        responses and transient HTTP statuses (5xx, 408, 429).
    timeout : socket timeout per attempt, in seconds.
    chunk : read size in bytes.
    backoff : seconds before the first retry, doubled on each further retry.
    allow_http : accept a plain http ``url`` (a trusted local mirror). Redirects
        must keep the scheme of ``url`` whatever this says.

    A GitHub code archive checked by the lock file is identified by commit and tree,
    its sha256 second (see the module doc).

    If ``dest`` already exists and verifies, nothing is downloaded. On a size
    or checksum mismatch the bad file is deleted and :class:`ChecksumError`
    names the URL, the file, and the expected and actual values.
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


# ---------------------------------------------------------------------------
# GitHub code archives: identified by commit and tree

_CODE_ARCHIVE = re.compile(r"/archive/([0-9a-f]{40})\.(?:tar\.gz|tgz|tar)$")


def code_archive_commit(url: str) -> str | None:
    """The commit of a GitHub-style code archive URL (``.../archive/<40 hex>.tar.gz``,
    on github.com or a mirror of it), else None."""
    match = _CODE_ARCHIVE.search(urlsplit(url).path)
    return match[1] if match else None


@dataclass(frozen=True)
class ArchiveIdentity:
    """What a code archive holds: the commit of its pax header and its git tree id."""

    commit: str | None  # None: no pax ``comment`` header
    tree: str  # 40 hex: git's tree id of the files below the single top folder


def archive_identity(path: str | os.PathLike) -> ArchiveIdentity:
    """The commit (``git archive``'s pax global header ``comment``) and the git tree
    id of a tar archive's content below its single top folder (``<repo>-<commit>/``).

    The tree id is git's: blobs ``sha1("blob <size>\\0" + data)``, files 100644 or
    100755 (owner-executable), symlinks 120000, directories 40000, entries in git's
    order. Empty directories (git has none; ``git archive`` writes submodules so)
    are left out.
    """
    with tarfile.open(path, "r:*") as archive:
        entries: dict[PurePosixPath, tuple[str, bytes]] = {}
        for member in archive:
            name = PurePosixPath(member.name)
            if member.isdir():
                continue
            if member.issym():
                mode, data = "120000", member.linkname.encode()
            elif member.isfile():
                mode = "100755" if member.mode & stat.S_IXUSR else "100644"
                data = archive.extractfile(member).read()
            else:
                raise ValueError(f"{path}: member {member.name!r} is neither file nor symlink")
            entries[name] = (mode, _git_object("blob", data))
        commit = archive.pax_headers.get("comment")
    tops = {name.parts[0] for name in entries}
    if len(tops) != 1 or any(len(name.parts) < 2 for name in entries):
        raise ValueError(f"{path}: a code archive holds one top folder, found {sorted(tops)[:5]}")
    tree = _git_tree({PurePosixPath(*n.parts[1:]): e for n, e in entries.items()})
    commit = commit.strip() if commit else None
    return ArchiveIdentity(
        commit if commit and re.fullmatch("[0-9a-f]{40}", commit) else None, tree.hex()
    )


def _git_object(kind: str, data: bytes) -> bytes:
    return hashlib.sha1(f"{kind} {len(data)}\0".encode() + data, usedforsecurity=False).digest()


def _git_tree(entries: dict[PurePosixPath, tuple[str, bytes]]) -> bytes:
    """git's tree id of files (path -> (mode, blob id)) relative to the tree's root."""
    children: dict[str, dict] = {}
    own: dict[str, tuple[str, bytes]] = {}
    for path, entry in entries.items():
        if len(path.parts) == 1:
            own[path.parts[0]] = entry
        else:
            children.setdefault(path.parts[0], {})[PurePosixPath(*path.parts[1:])] = entry
    for name, sub in children.items():
        own[name] = ("40000", _git_tree(sub))
    # git orders entries by name, a directory's name compared as if it ended in "/".
    order = sorted(own, key=lambda n: n.encode() + (b"/" if own[n][0] == "40000" else b""))
    body = b"".join(f"{own[n][0]} {n}\0".encode() + own[n][1] for n in order)
    return _git_object("tree", body)


def _check_commit(url: str, path: Path, identity: ArchiveIdentity, commit: str) -> None:
    if identity.commit != commit:
        path.unlink(missing_ok=True)
        raise ChecksumError(
            f"{url}: the archive's pax header names commit {identity.commit} "
            f"(None: no commit recorded), not the URL's {commit}; the file was deleted"
        )


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


def _code_archive_problem(path: Path, commit: str, entry: dict | None) -> str | None:
    try:
        identity = archive_identity(path)
    except (tarfile.TarError, OSError, ValueError) as err:
        return f"not a readable code archive: {err}"
    if identity.commit != commit:
        return f"pax header names commit {identity.commit}, not the URL's {commit}"
    if entry is not None and identity.tree != entry["tree"]:
        return f"tree: expected {entry['tree']}, got {identity.tree} (commit {commit})"
    return None


def _update_lock_entry(lockfile, url: str, path: Path, identity: ArchiveIdentity):
    """Record the archive's commit, tree, sha256 and size; the byte hash may change
    (logged), the tree may not (checked again under the lock)."""
    entry = {
        "commit": identity.commit,
        "tree": identity.tree,
        "sha256": file_digest(path, "sha256"),
        "size": path.stat().st_size,
    }
    lockfile = Path(lockfile)
    with _exclusive(lockfile):
        entries = read_lockfile(lockfile)
        recorded = entries.get(url)
        if recorded == entry:
            return
        if recorded is not None and recorded.get("tree", entry["tree"]) != entry["tree"]:
            path.unlink()
            raise ChecksumError(
                f"{url}: {path} holds tree {entry['tree']} but {lockfile} meanwhile recorded "
                f"{recorded['tree']}; the file was deleted"
            )
        if recorded is not None and recorded["sha256"] != entry["sha256"]:
            log.warning(
                "%s: same commit %s and tree %s, but the archive's bytes changed (sha256 %s, "
                "recorded %s): GitHub regenerated it; recording the new bytes",
                url,
                identity.commit,
                identity.tree,
                entry["sha256"],
                recorded["sha256"],
            )
        entries[url] = entry
        text = json.dumps(entries, indent=2, sort_keys=True) + "\n"
        with atomic_open(lockfile, "w", encoding="utf-8") as handle:
            handle.write(text)
    log.info(
        "recorded %s (commit %s, tree %s) in %s", url, identity.commit, identity.tree, lockfile
    )


def _expectations(url, sha256, md5, size, lockfile) -> tuple[_Expected, bool]:
    """What the file must match (the given checksums, else the lock file's record) and
    whether its digest is to be recorded in the lock file (the first download)."""
    sha256 = sha256.lower() if sha256 else None
    md5 = md5.lower() if md5 else None
    if sha256 is None and md5 is None and lockfile is None:
        raise ValueError(
            f"refusing to download {url} without verification: give sha256= or md5=, "
            "or a lockfile= to record the checksum of the first download"
        )
    record_in_lock = from_lock = False
    if sha256 is None and md5 is None:
        entry = read_lockfile(lockfile).get(url)
        if entry is None:
            record_in_lock = True
        else:
            sha256, from_lock = entry["sha256"], True
            if size is not None and entry.get("size") not in (None, size):
                raise ChecksumError(
                    f"{url}: size={size} was requested but {lockfile} records size={entry['size']}"
                )
            size = entry.get("size", size)
    expected = _Expected(
        sha256=sha256, md5=md5, size=size, lockfile=lockfile if from_lock else None
    )
    return expected, record_in_lock


def _check_scheme(url: str, *, allow_http: bool) -> None:
    scheme = urlsplit(url).scheme.lower()
    if scheme in SCHEMES or (scheme == "http" and allow_http):
        return
    if scheme == "http":
        raise ValueError(
            f"refusing to download {url} over plain http: use https, or allow http for a "
            "trusted local mirror (allow_http=True; config downloads_allow_http: true)"
        )
    raise ValueError(f"refusing to download {url}: scheme {scheme!r} is not https or file")


class _SameSchemeRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the scheme of the request (no https -> http)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        old, new = urlsplit(req.full_url).scheme.lower(), urlsplit(newurl).scheme.lower()
        if new != old:
            fp.close()
            raise DownloadError(
                f"refusing the redirect of {req.full_url} to {newurl}: it "
                f"changes the scheme from {old} to {new}"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_SameSchemeRedirects)


class _Expected:
    """What a file must look like, and a readable account of how it differs."""

    def __init__(self, *, sha256, md5, size, lockfile):
        self.sha256, self.md5, self.size = sha256, md5, size
        self.lockfile = lockfile  # set only when the expectation came from the lock file

    def problem(self, path: Path) -> str | None:
        actual_size = path.stat().st_size
        if self.size is not None and actual_size != self.size:
            return f"size: expected {self.size} bytes, got {actual_size} ({path})"
        for name, want in (("sha256", self.sha256), ("md5", self.md5)):
            if want is not None:
                got = file_digest(path, name)
                if got != want:
                    return f"{name}: expected {want}, got {got} ({path})"
        return None

    def lock_hint(self) -> str:
        if self.lockfile is None:
            return ""
        return (
            f". The expected sha256 was recorded in {self.lockfile} on first download; "
            "if the upstream file legitimately changed, delete its entry there"
        )


def _download_with_retries(url, part: Path, *, size, retries, timeout, chunk, backoff) -> None:
    failures = []
    for attempt in range(retries + 1):
        if attempt:
            delay = backoff * 2 ** (attempt - 1)
            log.info(
                "retrying %s in %.1f s (attempt %d of %d)", url, delay, attempt + 1, retries + 1
            )
            time.sleep(delay)
        try:
            _download_once(url, part, size=size, timeout=timeout, chunk=chunk)
            return
        except _Transient as err:
            failures.append(str(err))
            log.warning("download of %s failed: %s", url, err)
    raise DownloadError(
        f"could not download {url} after {retries + 1} attempts; "
        f"last error: {failures[-1]}"
        + (f" (partial data kept in {part} for resuming)" if part.exists() else "")
    )


def _download_once(url, part: Path, *, size, timeout, chunk) -> None:
    """One attempt: resume ``part`` if possible, else start it afresh."""
    offset = part.stat().st_size if part.exists() else 0
    if size is not None and offset > size:
        part.unlink()
        offset = 0
    if size is not None and offset == size:
        return  # a previous attempt got everything; verification decides
    response = _open(url, part, offset, timeout)
    with response:
        status = getattr(response, "status", None)
        if status == 206 and offset:
            if _range_start(response) != offset:
                part.unlink()
                raise _Transient(
                    f"server answered the range request for byte {offset} with "
                    f"{response.headers.get('Content-Range')!r}; restarting"
                )
            mode = "ab"
            log.info("resuming %s at byte %d", url, offset)
        else:
            mode, offset = "wb", 0  # the server ignored the range: restart
        length = response.headers.get("Content-Length")
        expected_body = int(length) if length is not None else None
        received = _receive(response, part, mode, offset, chunk)
    if expected_body is not None and received != expected_body:
        raise _Transient(f"response truncated: got {received} of {expected_body} bytes")


def _open(url, part: Path, offset: int, timeout):
    """The response to a GET of ``url`` from byte ``offset``; transient failures raise
    :class:`_Transient` (a refused range also deletes ``part``)."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    if offset:
        request.add_header("Range", f"bytes={offset}-")
    try:
        return _OPENER.open(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:
            # Our partial file does not fit the server's idea of the file: start over.
            part.unlink()
            raise _Transient(f"HTTP 416 for range starting at {offset}; restarting") from err
        if err.code in TRANSIENT_STATUSES:
            raise _Transient(f"HTTP {err.code} {err.reason}") from err
        raise DownloadError(f"could not download {url}: HTTP {err.code} {err.reason}") from err
    except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
        raise _Transient(f"{type(err).__name__}: {getattr(err, 'reason', err)}") from err


def _receive(response, part: Path, mode: str, offset: int, chunk: int) -> int:
    """Write the body to ``part`` (``mode`` "wb" or "ab"); returns the bytes received."""
    received = 0
    try:
        with open(part, mode) as out:
            while block := response.read(chunk):
                out.write(block)
                received += len(block)
    except (OSError, http.client.HTTPException) as err:
        raise _Transient(
            f"transfer interrupted after {offset + received} bytes: {type(err).__name__}: {err}"
        ) from err
    return received


def _range_start(response) -> int | None:
    """First byte of a ``Content-Range: bytes a-b/n`` header, or None."""
    value = response.headers.get("Content-Range", "")
    unit, _, spec = value.partition(" ")
    if unit.strip().lower() != "bytes":
        return None
    start = spec.split("-", 1)[0]
    return int(start) if start.isdigit() else None


# ---------------------------------------------------------------------------
# Lock file: url -> {"sha256", "size"}, sorted JSON, written atomically.


def read_lockfile(lockfile: str | os.PathLike) -> dict[str, dict]:
    """Entries of a checksum lock file ({} if it does not exist yet)."""
    path = Path(lockfile)
    if not path.exists():
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8") or "{}")
    except json.JSONDecodeError as err:
        raise ValueError(f"checksum lock file {path} is not valid JSON: {err}") from err
    if not isinstance(entries, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("sha256"), str) for e in entries.values()
    ):
        raise ValueError(
            f'checksum lock file {path} must map each URL to {{"sha256": <hex>, "size": <bytes>}}'
        )
    return entries


def _record_in_lockfile(lockfile, url: str, path: Path) -> None:
    entry = {"sha256": file_digest(path, "sha256"), "size": path.stat().st_size}
    lockfile = Path(lockfile)
    with _exclusive(lockfile):
        entries = read_lockfile(lockfile)
        recorded = entries.get(url)
        if recorded is not None:  # another process recorded it meanwhile
            if recorded["sha256"] != entry["sha256"]:
                path.unlink()
                raise ChecksumError(
                    f"{url}: {path} has sha256 {entry['sha256']} but {lockfile} meanwhile recorded "
                    f"{recorded['sha256']} from another download; the file was deleted"
                )
            return
        entries[url] = entry
        text = json.dumps(entries, indent=2, sort_keys=True) + "\n"
        with atomic_open(lockfile, "w", encoding="utf-8") as handle:
            handle.write(text)
    log.info("recorded sha256 %s of %s in %s", entry["sha256"], url, lockfile)


@contextmanager
def _exclusive(lockfile: Path):
    """Serialise read-modify-write of the lock file across processes."""
    lockfile.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # pragma: no cover
        yield
        return
    mutex = lockfile.with_name(f".{lockfile.name}.mutex")
    with open(mutex, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
