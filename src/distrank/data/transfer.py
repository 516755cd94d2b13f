"""Transfers: one URL streamed into ``<dest>.part``, retried and resumed.

:func:`distrank.data.download.fetch` verifies what arrives and renames it; this module
only moves the bytes. Interrupted transfers resume from the ``.part`` file with an
HTTP ``Range`` request when the server honours it; network errors, truncated
responses and transient HTTP statuses (``TRANSIENT_STATUSES``: 5xx, 408, 429) are
retried with a doubling back-off.

Downloads go over https (or read a local ``file://`` URL). Plain http, whose bytes
anyone on the path can swap (only the checksum would notice), is refused unless
the caller opts in with ``allow_http=True`` (config ``downloads_allow_http: true``,
for a trusted local mirror); a redirect that changes the scheme (https to http,
say) is refused either way.
"""

from __future__ import annotations

import http.client
import logging
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["DownloadError"]

log = logging.getLogger(__name__)

USER_AGENT = "distrank-fetch/0.1 (+python-urllib)"
# Statuses worth another try: the server or a proxy is temporarily unhappy.
TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# URL schemes fetched without an opt-in (plain http needs allow_http=True).
SCHEMES = ("https", "file")


class DownloadError(RuntimeError):
    """The file could not be downloaded (after all retries).

    Parameters
    ----------
    *args
        Those of the base exception: one message naming the URL and the (last) error.
    """


class _Transient(Exception):
    """Internal: an attempt failed in a way that another attempt may fix."""


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
