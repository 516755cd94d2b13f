"""Verification of downloads: published checksums, the checksum lock file, and
GitHub code archives identified by commit and git tree.

Every download is checked against something: a published checksum (``sha256``
or ``md5``) or, when none is published, the sha256 recorded on first download
in a lock file (``resources/checksums.lock``) that the user commits. Asking for
a download with neither is an error, never a silent skip.

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
import json
import logging
import os
import re
import stat
import tarfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from distrank._io import atomic_open, file_digest

from .transfer import DownloadError

try:  # POSIX only; without it concurrent lock-file updates are not serialised.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

__all__ = [
    "ArchiveIdentity",
    "ChecksumError",
    "archive_identity",
    "code_archive_commit",
    "read_lockfile",
]

log = logging.getLogger(__name__)


class ChecksumError(DownloadError):
    """A downloaded (or existing) file does not match its expected size or checksum.

    Parameters
    ----------
    *args
        Those of the base exception: one message naming the URL (or file) and the
        expected and actual values.
    """


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


# ---------------------------------------------------------------------------
# Published checksums, else the lock file's record


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


# ---------------------------------------------------------------------------
# Lock file: url -> {"sha256", "size"}, sorted JSON, written atomically.


def read_lockfile(lockfile: str | os.PathLike) -> dict[str, dict]:
    """Entries of a checksum lock file ({} if it does not exist yet).

    Parameters
    ----------
    lockfile : str or os.PathLike
        The JSON lock file (e.g. ``resources/checksums.lock``).

    Returns
    -------
    dict of str to dict
        URL -> its entry: ``sha256`` and ``size``, and for a GitHub code archive also
        ``commit`` and ``tree``.

    Raises
    ------
    ValueError
        The file is not valid JSON, or does not map each URL to an entry with a
        ``sha256`` string.
    """
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
