"""Shared fixtures: the tiny end-to-end study and the small one, each run once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY_CONFIG = REPO / "tests/e2e/tiny.yaml"
# E1 and E3 on 100 images: every kind of job (data, training, generation, features,
# partition, client and central scoring, tables) in about a minute.
SMALL_CONFIG = REPO / "tests/reliability/small.yaml"


@pytest.fixture(autouse=True)
def _close_figures():
    """Each test's matplotlib figures closed after it (a figure a test forgets stays open)."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def snakemake_tiny(
    workdir: Path, *args: str, timeout: int = 1800, config: Path = TINY_CONFIG
) -> subprocess.CompletedProcess:
    """The real snakemake on the tiny config in `workdir` (stdout and stderr together)."""
    cmd = [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(workdir),
        "--configfile",
        str(config),
        *args,
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DISTRANK_QUIET": "1"}
    return subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=timeout
    )


@pytest.fixture(scope="session")
def run_tiny():
    """`snakemake_tiny` for tests: run the tiny config in a working directory."""
    return snakemake_tiny


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory) -> Path:
    """A working directory in which the tiny study has run locally to completion."""
    workdir = tmp_path_factory.mktemp("tiny-local")
    run = snakemake_tiny(workdir, "--cores", "2")
    assert run.returncode == 0, run.stdout[-5000:]
    return workdir


@pytest.fixture(scope="session")
def small_clean(tmp_path_factory) -> Path:
    """A working directory in which small.yaml has run once, uninterrupted, to the end."""
    workdir = tmp_path_factory.mktemp("small-clean")
    run = snakemake_tiny(workdir, "--cores", "2", config=SMALL_CONFIG)
    assert run.returncode == 0, run.stdout[-5000:]
    return workdir


# --- no network but the loopback --------------------------------------------------------------
# Every socket of the test process (and its threads) may connect, bind and send only to
# 127.0.0.0/8, ::1 or "localhost"; anything else raises SocketGuardError at the call and
# fails the test that did it, even where the code under test swallows the error. Unix
# sockets are local and allowed. Subprocesses (snakemake, flwr, chromium) are out of its
# reach: they are kept local by their own arguments (127.0.0.1 servers, offline flags).


class SocketGuardError(RuntimeError):
    """A test opened a socket to an address other than the loopback."""


def _loopback(host) -> bool:
    import ipaddress

    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return False  # another host name, "" or "<broadcast>": not the loopback
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


_VIOLATIONS: list[str] = []


def _guarded(name: str, original):
    import functools
    import socket

    @functools.wraps(original)
    def guarded(sock, *args):
        address = args[-1] if args else None  # (address), sendto(data[, flags], address)
        if (
            sock.family in (socket.AF_INET, socket.AF_INET6)
            and isinstance(address, tuple)
            and not _loopback(address[0])
        ):
            message = f"socket.{name}({address!r}): the tests may reach 127.0.0.1 / ::1 only"
            _VIOLATIONS.append(message)
            raise SocketGuardError(message)
        return original(sock, *args)

    return guarded


@pytest.fixture(scope="session", autouse=True)
def _socket_guard():
    import socket

    with pytest.MonkeyPatch.context() as patch:
        for name in ("connect", "connect_ex", "bind", "sendto"):
            patch.setattr(socket.socket, name, _guarded(name, getattr(socket.socket, name)))
        yield


@pytest.fixture(autouse=True)
def _no_network(_socket_guard):
    """Fails the test (at teardown) that tried to reach an address other than the loopback."""
    del _VIOLATIONS[:]
    yield
    if _VIOLATIONS:
        found = list(_VIOLATIONS)
        del _VIOLATIONS[:]
        pytest.fail("network access outside the loopback: " + "; ".join(found), pytrace=False)


@pytest.fixture
def blocked_sockets(_no_network) -> list[str]:
    """The guard's record of this test's refused calls (a test of the guard clears it)."""
    return _VIOLATIONS


# --- parallel runs (pytest-xdist) ---------------------------------------------------------------
# pyproject's addopts run the suite on two workers (-n 2 --dist loadgroup). A fixture shared
# beyond one test is built once per worker that uses it, so the tests that share an expensive
# one go to one worker as a group: the snakemake studies and the SLURM cluster (one per
# machine: fixed ports and state folder), the documentation build, and each module's
# (package's) module- (package-) scoped fixtures. Every other test is scheduled on its own.
#
# The groups travel by file, not by xdist_group marks: xdist 3.8 marks a group by appending
# "@group" to the node id, which pytest 9.2's structured node ids ignore
# (pytest-dev/pytest-xdist#1386), so every test would be scheduled alone. Each worker writes
# {node id: group} of its collection to a folder the controller names, and the controller's
# scheduler (loadgroup's, with that map) reads it once all workers have collected.

#: session fixtures too costly to build twice -> the group of every test that requests them
SHARED_SESSION_FIXTURES = {
    "slurm_cluster": "small-study",  # whose last test also needs small_clean
    "small_clean": "small-study",
    "tiny_study": "tiny-study",
    "build": "docs-site",  # sphinx, once; `site` serves it
}
GROUPS_DIR = "distrank_xdist_groups"  # the workerinput key: where workers write their groups


def _requested_fixtures(item) -> dict:
    """The fixtures `item` asks for (its arguments, usefixtures, and what those ask for;
    not the autouse fixtures of its scope): name -> the FixtureDef that serves it."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return {}
    defs = info.name2fixturedefs
    todo = list(info.argnames)
    todo += [name for mark in item.iter_markers("usefixtures") for name in mark.args]
    found = {}
    while todo:
        name = todo.pop()
        if name in found or not defs.get(name):
            continue
        found[name] = defs[name][-1]
        todo.extend(found[name].argnames)
    return found


def xdist_group(item) -> str | None:
    """The group of tests that must run on `item`'s worker, or None (any worker)."""
    for mark in item.iter_markers("xdist_group"):  # a test's own mark comes first
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    fixtures = _requested_fixtures(item)
    for name, group in SHARED_SESSION_FIXTURES.items():
        if name in fixtures:
            return group
    packages = sorted(f.baseid for f in fixtures.values() if f.scope == "package")
    if packages:
        return packages[0]
    if any(fixture.scope in ("module", "class") for fixture in fixtures.values()):
        return str(item.path.relative_to(REPO))
    return None


def pytest_collection_modifyitems(config, items):
    folder = getattr(config, "workerinput", {}).get(GROUPS_DIR)
    if folder:  # an xdist worker: tell the controller's scheduler the groups
        import json

        groups = {item.nodeid: xdist_group(item) for item in items}
        path = Path(folder) / f"{config.workerinput['workerid']}.json"
        path.with_suffix(".tmp").write_text(json.dumps({k: v for k, v in groups.items() if v}))
        path.with_suffix(".tmp").replace(path)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist controller) the folder that each worker writes its groups to."""
    import tempfile

    config = node.config
    if not hasattr(config, "_distrank_groups"):
        config._distrank_groups = tempfile.mkdtemp(prefix="distrank-xdist-groups-")
    node.workerinput[GROUPS_DIR] = config._distrank_groups


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """(xdist controller) --dist loadgroup with the workers' groups (see above)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    import json

    from xdist.scheduler import LoadGroupScheduling

    class FileGroupScheduling(LoadGroupScheduling):
        groups: dict[str, str] = {}

        def schedule(self):
            if self.collection is None and hasattr(config, "_distrank_groups"):
                for path in sorted(Path(config._distrank_groups).glob("*.json")):
                    self.groups = {**json.loads(path.read_text()), **self.groups}
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return FileGroupScheduling(config, log)


def pytest_unconfigure(config):
    import shutil

    if hasattr(config, "_distrank_groups"):
        shutil.rmtree(config._distrank_groups, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    # A selection that collects no test is not a failure of the suite.
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK
