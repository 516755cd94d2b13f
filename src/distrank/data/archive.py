"""Safe extraction of downloaded archives (.tar, .tar.gz/.tgz and other tar compressions, .zip).

An archive is untrusted input: a member named ``../../.bashrc``, ``/etc/passwd``
or a symlink to ``/`` followed by a member written "through" it would write
outside the target directory. :func:`safe_extract` checks every member before
writing anything, then extracts into a temporary directory beside ``dest`` and
renames it into place, so ``dest`` either appears complete or not at all.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path

__all__ = ["UnsafeArchiveError", "safe_extract"]

_DRIVE = re.compile(r"^[A-Za-z]:")


class UnsafeArchiveError(ValueError):
    """An archive member would be written outside the extraction directory.

    Parameters
    ----------
    *args
        Those of the base exception: :func:`safe_extract` passes one message naming the
        archive and its offending members (the first five).
    """


def safe_extract(archive_path: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Extract a tar or zip archive into ``dest`` and return ``dest`` as a Path.

    The format is recognised from the content, not the file name (a download
    named ``afhq.zip?dl=1`` works). Raises :class:`UnsafeArchiveError`, before
    anything is written, if any member has an absolute path or a ``..``
    component, is a symlink or hard link pointing outside ``dest``, lies
    beneath a symlink member, or is a device or FIFO. ``dest`` must not exist
    or be an empty directory.

    Parameters
    ----------
    archive_path : str or os.PathLike
        The archive: a zip, or a tar of any compression ``tarfile`` reads.
    dest : str or os.PathLike
        The directory to extract into, created by renaming a temporary one beside it.

    Returns
    -------
    pathlib.Path
        ``dest``, holding the archive's members.

    Raises
    ------
    UnsafeArchiveError
        An unsafe member (above); nothing is written.
    FileExistsError
        ``dest`` exists and is not an empty directory.
    ValueError
        The file is neither a zip nor a tar archive.
    """
    archive_path, dest = Path(archive_path), Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(
            f"cannot extract {archive_path}: {dest} already exists and is not an empty directory"
        )
    if zipfile.is_zipfile(archive_path):
        with zipfile.ZipFile(archive_path) as archive:
            _check_all(archive_path, (_zip_member(info) for info in archive.infolist()))
            _extract_atomically(dest, archive.extractall)
    else:
        try:
            archive = tarfile.open(archive_path, "r:*")
        except tarfile.TarError as err:
            raise ValueError(f"{archive_path} is neither a zip nor a tar archive: {err}") from err
        with archive:
            members = archive.getmembers()
            _check_all(archive_path, (_tar_member(info) for info in members))
            # The standard library's "data" filter re-checks the same rules at write time.
            _extract_atomically(dest, lambda tmp: archive.extractall(tmp, members, filter="data"))
    return dest


def _zip_member(info: zipfile.ZipInfo) -> tuple[str, str, str | None]:
    # zipfile never creates links on extraction, so every member is a path.
    return info.filename, "dir" if info.is_dir() else "file", None


def _tar_member(info: tarfile.TarInfo) -> tuple[str, str, str | None]:
    if info.issym():
        return info.name, "symlink", info.linkname
    if info.islnk():
        return info.name, "hardlink", info.linkname
    if info.isdir():
        return info.name, "dir", None
    if info.isfile():
        return info.name, "file", None
    return info.name, "special", None


def _check_all(archive_path: Path, members) -> None:
    problems, symlinks = [], set()
    for name, kind, link in members:
        problem = _member_problem(name, kind, link, symlinks)
        if problem:
            problems.append(f"{name!r}: {problem}")
        if kind == "symlink":
            symlinks.add(posixpath.normpath(name))
    if problems:
        shown = "; ".join(problems[:5])
        if len(problems) > 5:
            shown += f"; ... ({len(problems)} in all)"
        raise UnsafeArchiveError(
            f"refusing to extract {archive_path}, nothing was extracted: {shown}"
        )


def _member_problem(name: str, kind: str, link: str | None, symlinks: set[str]) -> str | None:
    if kind == "special":
        return "device files and FIFOs are not allowed"
    path_problem = _relative_path_problem(name)
    if path_problem:
        return path_problem
    normalized = posixpath.normpath(name)
    parts = normalized.split("/")
    for depth in range(1, len(parts)):
        if "/".join(parts[:depth]) in symlinks:
            return f"lies beneath the symlink member {'/'.join(parts[:depth])!r}"
    if kind == "symlink":
        target = posixpath.normpath(posixpath.join(posixpath.dirname(normalized), link))
        if posixpath.isabs(link) or _DRIVE.match(link) or _escapes(target):
            return f"symlink to {link!r} points outside the extraction directory"
    if kind == "hardlink":
        # Hard link targets are archive member names, relative to the archive root.
        link_problem = _relative_path_problem(link)
        if link_problem:
            return f"hard link to {link!r}: {link_problem}"
    return None


def _relative_path_problem(name: str) -> str | None:
    if not name:
        return "empty member name"
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        return "absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "path contains '..'"
    return None


def _escapes(normalized: str) -> bool:
    return normalized == ".." or normalized.startswith("../") or posixpath.isabs(normalized)


def _extract_atomically(dest: Path, extract) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.extracting-"))
    try:
        extract(tmp)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; dest gets normal permissions
        if dest.is_dir():
            dest.rmdir()  # checked empty above
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
