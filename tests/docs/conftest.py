"""The documentation site built once per session, strictly, and served on 127.0.0.1."""

from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


@pytest.fixture(scope="session")
def build(tmp_path_factory):
    """`sphinx -b html -W --keep-going -n docs <tmp>`: (completed process, output dir,
    seconds). A warning (a broken link, a missing API object, a docstring that is not
    valid reStructuredText, a missing figure) fails the build."""
    pytest.importorskip("sphinx")
    out = tmp_path_factory.mktemp("docs") / "html"
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-n", "-q"]
    start = time.monotonic()
    run = subprocess.run(
        [*cmd, str(DOCS), str(out)], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    return run, out, time.monotonic() - start


@pytest.fixture(scope="session")
def site(build):
    """The built site, served over http on 127.0.0.1 (as a reader's browser sees it):
    its base URL and folder."""
    run, out, _ = build
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    handler = functools.partial(Quiet, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", out
    server.shutdown()
    server.server_close()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
