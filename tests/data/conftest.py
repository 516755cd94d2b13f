"""A local HTTP file server on 127.0.0.1 for the download tests.

It serves a temporary directory, honours single ``Range: bytes=a-[b]``
requests (206 + Content-Range), follows configured redirects, and can be told
to fail the next N requests with an HTTP status or to cut the next N response
bodies short (Content-Length announces the full body, the connection closes
early), so retries and resumption run against real sockets.
"""

from __future__ import annotations

import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class FileServer:
    root: Path
    base_url: str = ""
    accept_ranges: bool = True
    requests: list[dict] = field(default_factory=list)
    redirects: dict[str, str] = field(default_factory=dict)
    _failures: list[int] = field(default_factory=list)
    _truncations: list[int] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def put(self, name: str, data: bytes) -> str:
        """Serve ``data`` at ``/name``; return its URL."""
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return self.url(name)

    def fail_next(self, n: int, status: int = 500) -> None:
        """Answer the next ``n`` requests with ``status``."""
        with self._lock:
            self._failures.extend([status] * n)

    def truncate_next(self, n: int, keep: int) -> None:
        """Send only the first ``keep`` body bytes of the next ``n`` responses."""
        with self._lock:
            self._truncations.extend([keep] * n)

    def _pop(self, queue: list[int]) -> int | None:
        with self._lock:
            return queue.pop(0) if queue else None


class _Handler(BaseHTTPRequestHandler):
    server_version = "distrank-test/1.0"

    def log_message(self, format, *args):  # keep pytest output clean
        pass

    def do_GET(self):
        state: FileServer = self.server.state
        parsed = urllib.parse.urlsplit(self.path)
        state.requests.append(
            {"path": parsed.path, "query": parsed.query, "range": self.headers.get("Range")}
        )
        status = state._pop(state._failures)
        if status is not None:
            self.send_error(status, "injected failure")
            return
        if parsed.path in state.redirects:
            self.send_response(302)
            self.send_header("Location", state.redirects[parsed.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = (state.root / urllib.parse.unquote(parsed.path).lstrip("/")).resolve()
        if state.root.resolve() not in path.parents or not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        start, end, status = 0, len(data), 200
        match = _RANGE.match(self.headers.get("Range") or "")
        if match and state.accept_ranges:
            start = int(match[1])
            end = min(int(match[2]) + 1, len(data)) if match[2] else len(data)
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        body = data[start:end]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        if state.accept_ranges:
            self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        keep = state._pop(state._truncations)
        self.wfile.write(body if keep is None else body[:keep])
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def http_server(tmp_path_factory):
    """A running :class:`FileServer`; files put in ``server.root`` are served."""
    state = FileServer(root=tmp_path_factory.mktemp("served"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.state = state
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
    )
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
