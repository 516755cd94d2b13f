"""One flower-superlink and its SuperNode processes on 127.0.0.1, with ``flwr`` pointed
at them (tests/flower/test_flower_loopback.py, test_flower_pinned_app.py,
bench/bench_flower.py). The SuperNodes are stock ``flower-supernode`` unless told
otherwise (``PINNED``: distrank's, which runs only the FABs it pinned).

Every process is started in its own session and stopped by killing its process group
(a SuperNode's SuperExec child lingers otherwise). A run's status comes from ``flwr
ls``, never from an exit code (``flwr run --stream`` exits 0 when the run failed).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from distrank.flower import APP_DIR

BIN = Path(sys.executable).parent
QUIET = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "OMP_NUM_THREADS": "1",
}
#: the SuperNode command of a site that runs only pinned FABs (distrank.flower.supernode)
PINNED = (sys.executable, "-m", "distrank.flower.supernode")
#: a ``key=value`` pair of a node config string, as ``flower-supernode`` reads them
PAIR = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")


def free_ports(k: int) -> list[int]:
    socks = [socket.socket() for _ in range(k)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Loopback:
    """A SuperLink and its SuperNodes on 127.0.0.1, with ``flwr`` pointed at them: each
    site's SuperNode runs ``supernode`` (a command name in the venv, or an argv) with the
    site's node config, followed by ``extra[site]`` (more TOML ``key=value`` pairs, which
    replace the defaults they name, e.g. ``plain=""``)."""

    def __init__(
        self,
        root: Path,
        sites: dict[str, Path],
        supernode: Sequence[str] = ("flower-supernode",),
        extra: Mapping[str, str] | None = None,
    ):
        self.root, self.procs, self.logs = root, {}, {}
        self.tomls = itertools.count()  # run config files (runs may start from threads)
        link, *nodes = free_ports(1 + len(sites))
        home = root / "home-cli"
        home.mkdir()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
            f'address = "127.0.0.1:{link}"\ninsecure = true\n'
        )
        self.env = (
            os.environ
            | QUIET
            | {"FLWR_HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
        )
        self.start("superlink", "flower-superlink", "--insecure", "--port", str(link))
        self.wait_listening(link)
        for (name, path), port in zip(sites.items(), nodes):
            config = {
                "site-id": f'"{name}"',
                "features": f'"{path}"',
                "share-stats": "true",
                "device": '"cpu"',
                "plain": '"scores,sketch"',
            } | dict(PAIR.findall((extra or {}).get(name, "")))  # a key given twice: extra's
            self.start(
                name,
                *supernode,
                "--insecure",
                "--superlink",
                f"127.0.0.1:{link}",
                "--port",
                str(port),
                "--node-config",
                " ".join(f"{key}={value}" for key, value in config.items()),
            )

    @classmethod
    def of_arrays(cls, root: Path, sites: dict, models: dict, **kw) -> tuple[Loopback, dict]:
        """Each site's and model's features written to ``root/<name>.npz``, a network of
        the sites (``kw``: ``supernode`` and ``extra`` of ``Loopback``), and the run config
        that names the models and sites."""
        paths = {}
        for name, x in {**sites, **models}.items():
            paths[name] = root / f"{name}.npz"
            np.savez(paths[name], features=x)
        config = {
            "models": ",".join(f"{m}={paths[m]}" for m in models),
            "sites": ",".join(sites),
        }
        return cls(root, {s: paths[s] for s in sites}, **kw), config

    def start(self, name: str, *cmd: str) -> None:
        """Start ``cmd`` in its own session, with its own Flower home (apps unpack there)."""
        self.logs[name] = self.root / f"{name}.log"
        home = self.root / f"home-{name}"
        home.mkdir()
        with open(self.logs[name], "wb") as log:
            self.procs[name] = subprocess.Popen(
                [str(BIN / cmd[0]), *cmd[1:]],
                env=self.env | {"FLWR_HOME": str(home)},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_listening(self, port: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        raise AssertionError(f"no SuperLink on port {port}: {self.logs['superlink'].read_text()}")

    def kill(self, name: str, sig=signal.SIGTERM) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=15)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)

    def flwr(self, *args: str, timeout: float = 120) -> dict:
        out = subprocess.run(
            [str(BIN / "flwr"), *args, "--format", "json"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.root,
        )
        try:
            return json.loads(out.stdout)
        except json.JSONDecodeError:
            raise AssertionError(f"flwr {args}: {out.stdout}\n{out.stderr}") from None

    def run(self, config: dict, app: Path = APP_DIR) -> str:
        """Start the Flower app in folder ``app`` (distrank's) with run config ``config``."""
        toml = self.root / f"run-{next(self.tomls)}.toml"
        toml.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
        started = self.flwr("run", str(app), "loopback", "--run-config", str(toml))
        assert started.get("success"), started
        return started["run-id"]

    def wait_finished(self, run_id: str, timeout: float) -> dict:
        # One `flwr log` (its stream ends when the run does) instead of polling `flwr ls`:
        # each flwr call is a Python start-up of about a CPU-second.
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run(
                    [str(BIN / "flwr"), "log", run_id, "loopback", "--stream"],
                    env=self.env,
                    capture_output=True,
                    timeout=left,
                    cwd=self.root,
                )
            (run,) = self.flwr("ls", "loopback", "--run-id", run_id)["runs"]
            if run["status"].startswith("finished"):
                return run
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        raise AssertionError(
            f"run {run_id} not finished after {timeout} s: {run}\n"
            + self.logs["superlink"].read_text()[-3000:]
        )

    def close(self) -> None:
        for name in list(self.procs):
            self.kill(name)
