"""A deployment as docs/flower.md describes it, on 127.0.0.1, with its own commands.

The test makes a CA and a server certificate for 127.0.0.1 and localhost (``ca.crt``,
``server.pem``, ``server.key``), starts ``flower-superlink`` with TLS and SuperNode
authentication, registers each site's SuperNode key with ``flwr supernode register``,
pins each site's long-term key in ``peers.json`` (``python -m distrank.flower.identity``)
and starts three pinned SuperNodes (``python -m distrank.flower.supernode``) with the
node configs the docs show, a release policy with noise, a budget and a ledger among
them. A fourth SuperNode, whose key nobody registered, is turned away. Through a
``~/.flwr``-style ``config.toml`` whose connection names the CA (no ``insecure``), ``flwr
run "$(python -m distrank.flower)" consortium --run-config run.toml --stream`` runs a
secure KD run with noise and a secure sketch run with noise (started together: each
ClientApp start is a Python start-up, and the two runs overlap their waits); ``flwr ls
consortium --format json`` gives each run's status, and the tables, their ``.meta.json``
and every site's ledger are read back: values against ``distrank score`` within their
noise, the noise each site attested, and the releases each ledger recorded.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from flwr.supercore.exit import ExitCode
from loopback import BIN, PINNED, QUIET, Loopback, free_ports

from distrank.flower import APP_DIR, supernode
from distrank.flower.secure.server import bounds_path, sketch_path
from distrank.metrics import score
from distrank.metrics._privacy import epsilon_spent
from distrank.metrics._table import meta_path
from distrank.metrics.sketch import _maps as sk

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:GitWildMatchPattern:DeprecationWarning"),  # FAB builds
]

SITES = ("oslo", "paris", "rome")
KEY = ["model", "metric", "aggregation", "client"]
#: the public bounds every site's policy and every run config state (rows: 60 to 100)
BOUNDS = {"feature-bound": 12.0, "max-rows": 1000}
MIN_ROWS = 50
#: each site's noise and budget, and the run config's (the docs' secure-mode keys)
EPSILON, DELTA, BUDGET = 4.0, 1e-5, 12.0
KERNEL = {"kernel": "rbf", "kernel-params": "bandwidth=3"}


# --- the files a coordinator and its sites make ----------------------------------------------


def tls_files(root: Path) -> tuple[Path, Path, Path]:
    """(ca.crt, server.pem, server.key): a CA and the SuperLink's certificate, signed by
    it, for 127.0.0.1 and localhost."""
    now = datetime.datetime.now(datetime.UTC)

    def cert(subject: str, key, issuer: str, signer, extensions):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca = cert("distrank test CA", ca_key, "distrank test CA", ca_key, [
        (x509.BasicConstraints(ca=True, path_length=0), True),
    ])  # fmt: skip
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = cert("localhost", key, "distrank test CA", ca_key, [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.SubjectAlternativeName(names), False),
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
    ])  # fmt: skip
    pem = serialization.Encoding.PEM
    paths = root / "ca.crt", root / "server.pem", root / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(server.public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


def auth_key(path: Path) -> Path:
    """A SuperNode's authentication key (P-384, OpenSSH format, as ``ssh-keygen -t ecdsa
    -b 384`` writes it) at ``path`` and its public half at ``<path>.pub``."""
    key = ec.generate_private_key(ec.SECP384R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    public = path.with_name(path.name + ".pub")
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    return public


def toml(values: dict) -> str:
    """``key = value`` lines (TOML: JSON's strings, numbers and booleans are TOML's)."""
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())


# --- the deployment --------------------------------------------------------------------------


class Deployment(Loopback):
    """A SuperLink with TLS and SuperNode authentication, and pinned SuperNodes that
    authenticate and check its certificate, on 127.0.0.1; ``flwr`` reaches it as the
    connection ``consortium`` of its ``config.toml``. Processes as ``Loopback`` runs them
    (own sessions, own Flower homes, killed by process group)."""

    def __init__(self, root: Path):  # noqa: D107 (Loopback's __init__ starts insecure ones)
        self.root, self.procs, self.logs = root, {}, {}
        self.tomls = itertools.count()
        self.ca, cert, key = tls_files(root)
        self.link, *self.ports = free_ports(1 + len(SITES) + 1)
        home = root / "home-cli"
        home.mkdir()
        address = f'address = "127.0.0.1:{self.link}"\n'
        (home / "config.toml").write_text(  # the connection of docs/flower.md's "Run"
            f'[superlink.consortium]\n{address}root-certificates = "{self.ca}"\n\n'
            f"[superlink.untrusted]\n{address}\n"  # the system's CAs, not the test's
            f"[superlink.plaintext]\n{address}insecure = true\n"
        )
        path = f"{BIN}{os.pathsep}{os.environ['PATH']}"
        self.env = os.environ | QUIET | {"FLWR_HOME": str(home), "PATH": path}
        self.start(
            "superlink",
            "flower-superlink",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.link),
            "--ssl-ca-certfile",
            str(self.ca),
            "--ssl-certfile",
            str(cert),
            "--ssl-keyfile",
            str(key),
            "--enable-supernode-auth",
        )
        self.wait_listening(self.link)

    def supernode(self, name: str, port: int, node_config: dict) -> None:
        """Start ``name``'s pinned SuperNode (auth key ``<name>.auth``), as the docs do."""
        self.start(
            name,
            *PINNED,
            "--superlink",
            f"127.0.0.1:{self.link}",
            "--root-certificates",
            str(self.ca),
            "--auth-supernode-private-key",
            str(self.root / f"{name}.auth"),
            "--port",
            str(port),
            "--node-config",
            " ".join(f"{key}={json.dumps(value)}" for key, value in node_config.items()),
        )

    def runs(self) -> dict[str, dict]:
        """Run id -> run, as ``flwr ls consortium --format json`` lists them."""
        listed = self.flwr("ls", "consortium")
        assert listed.get("success"), listed
        return {run["run-id"]: run for run in listed["runs"]}

    def run_streamed(self, config: dict, timeout: float = 300) -> dict:
        """``flwr run "$(python -m distrank.flower)" consortium --run-config run.toml
        --stream``, then the run it started, from ``flwr ls consortium --format json``."""
        app = subprocess.run(
            [sys.executable, "-m", "distrank.flower"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env=self.env,
        ).stdout.strip()
        assert Path(app) == APP_DIR
        run_toml = self.root / f"run-{next(self.tomls)}.toml"
        run_toml.write_text(toml(config))
        streamed = subprocess.run(
            [str(BIN / "flwr"), "run", app, "consortium", "--run-config", str(run_toml)]
            + ["--stream"],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        started = re.findall(r"Successfully started run (\d+)", streamed.stdout)
        assert len(started) == 1, (streamed.stdout[-3000:], streamed.stderr[-3000:])
        return self.runs()[started[0]]

    def tail(self, name: str, chars: int = 3000) -> str:
        return self.logs[name].read_text()[-chars:]

    def close(self) -> None:
        """Every process group signalled at once, then each awaited (``Loopback.kill``)."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        super().close()


def node_config(root: Path, site: str, peers: Path) -> dict:
    """A site's node config as the docs show it, with a noised release policy."""
    return {
        "site-id": site,
        "features": str(root / f"{site}.npz"),
        "share-stats": True,
        "signing-key": str(root / f"{site}.key"),
        "peers": str(peers),
        **BOUNDS,
        "min-rows": MIN_ROWS,
        "noise-epsilon": EPSILON,
        "noise-delta": DELTA,
        "budget-epsilon": BUDGET,
        "ledger": str(root / f"{site}.ledger.jsonl"),
        "device": "cpu",
    }


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, federation):
    """(the deployment, its run config's models and sites, the registered node ids by
    site, the unregistered SuperNode's exit code, ``flwr supernode ls``'s nodes)."""
    sites, models = federation
    root = tmp_path_factory.mktemp("deployment")
    for name, x in {**sites, **models}.items():
        np.savez(root / f"{name}.npz", features=x)
    net = Deployment(root)
    try:
        # the sites' long-term keys, as the docs make them, pinned in peers.json
        with ThreadPoolExecutor(len(SITES)) as pool:
            public = pool.map(
                lambda s: subprocess.run(
                    [sys.executable, "-m", "distrank.flower.identity", str(root / f"{s}.key")],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=True,
                    env=net.env,
                ).stdout.strip(),
                SITES,
            )
            peers = root / "peers.json"
            peers.write_text(json.dumps(dict(zip(SITES, public))))
            # each SuperNode's authentication key, registered with the SuperLink
            registered = dict(
                zip(
                    SITES,
                    pool.map(
                        lambda s: net.flwr(
                            "supernode", "register", str(auth_key(root / f"{s}.auth")), "consortium"
                        ),
                        SITES,
                    ),
                )
            )
        assert all(r.get("success") for r in registered.values()), registered
        nodes = {site: int(r["node-id"]) for site, r in registered.items()}
        auth_key(root / "mallory.auth")  # a SuperNode whose key nobody registered
        np.savez(root / "mallory.npz", features=sites["oslo"])
        for site, port in zip((*SITES, "mallory"), net.ports):
            net.supernode(site, port, node_config(root, site, peers))
        mallory = net.procs["mallory"].wait(timeout=90)
        deadline = time.monotonic() + 90
        while True:
            listed = net.flwr("supernode", "ls", "consortium")
            online = {int(n["node-id"]): n["status"] for n in listed["nodes"]}
            if set(online.values()) == {"online"} or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        config = {
            "models": ",".join(f"{m}={root / m}.npz" for m in models),
            "sites": ",".join(SITES),
        }
        yield net, config, nodes, mallory, online
    finally:
        net.close()


#: each run's config beyond the deployment's models and sites: both secure, with noise
RUNS = {
    "kd": {"metrics": "kd", "out": "scores.csv"},
    "sketch": {"metrics": "kd_sketch", "out": "sketch.csv", "seed": 4},
}


@pytest.fixture(scope="module")
def runs(deployment):
    """Run name -> (its run, from ``flwr ls``; its table): the secure KD run with noise
    and the secure sketch run, started together (each ``--stream`` waits for its end)."""
    net, config, *_ = deployment
    common = {"secure": True, **BOUNDS, **KERNEL, "noise-epsilon": EPSILON, "noise-delta": DELTA}
    common |= {"timeout": 240.0, "dtype": "float64"}
    configs = {
        name: config | common | run | {"out": str(net.root / run["out"])}
        for name, run in RUNS.items()
    }
    with ThreadPoolExecutor(len(configs)) as pool:
        started = dict(zip(configs, pool.map(net.run_streamed, configs.values())))
    return {name: (run, Path(configs[name]["out"])) for name, run in started.items()}


def test_registered_supernodes_are_served_and_an_unregistered_one_is_not(deployment):
    """The three registered keys' nodes are online; the fourth SuperNode is refused at
    activation and exits (Flower logs its exit code 305, the process exits 1) without
    ever being listed."""
    net, _, nodes, mallory, online = deployment
    codes = [int(c) for c in re.findall(r"Exit Code: (\d+)", net.logs["mallory"].read_text())]
    assert mallory == 1 and codes == [ExitCode.SUPERNODE_CONNECTION_ERROR], net.tail("mallory")
    assert online == dict.fromkeys(nodes.values(), "online"), net.tail("superlink")


def test_the_superlink_answers_only_tls_checked_against_its_ca(deployment):
    """``flwr`` reaches it with the test's CA only: not with the system's CAs, not in
    plaintext (``insecure = true``)."""
    net, *_ = deployment
    with ThreadPoolExecutor(2) as pool:
        answers = dict(
            zip(
                ("untrusted", "plaintext"),
                pool.map(lambda c: net.flwr("ls", c), ("untrusted", "plaintext")),
            )
        )
    assert {c: a["success"] for c, a in answers.items()} == {
        "untrusted": False,
        "plaintext": False,
    }, answers
    assert net.flwr("ls", "consortium")["success"]


def scored(out: Path, reference, models, metric: str) -> pd.DataFrame:
    """The table at ``out`` merged with ``distrank score``'s (same kernel and seed) and
    the bounds and noise stds written beside it."""
    table = pd.read_csv(out, keep_default_na=False)
    expected = score(
        *reference,
        models,
        metrics=[metric],
        kernel="rbf",
        kernel_params={"bandwidth": 3.0},
        seed=RUNS["sketch"]["seed"] if metric == "kd_sketch" else 0,
        dtype="float64",
    )
    merged = table.merge(expected, on=KEY, suffixes=("", "_score")).merge(
        pd.read_csv(bounds_path(out)), on=["model", "metric", "aggregation"]
    )
    assert len(merged) == len(table) == len(models), (table, expected)
    assert np.isfinite(merged.value).all() and (merged.noise_std > 0).all(), merged
    return merged


def attested(out: Path, block: str) -> dict:
    """Site -> what it attested for the run of ``out``, after checking the meta's sites
    and that each site's policy is the node config's and the release's noise is the
    sites' together."""
    meta = json.loads(meta_path(out).read_text())
    secure, privacy = meta["secure"], meta["privacy"]
    assert secure["sites"] == list(SITES) and secure["dropped"] == [], secure
    assert privacy["requested"] == {"epsilon": EPSILON, "delta": DELTA}, privacy
    said = secure["attested"]
    assert sorted(said) == list(SITES), said
    for site, it in said.items():
        assert (it["noise-epsilon"], it["noise-delta"], it["budget-epsilon"]) == (
            EPSILON,
            DELTA,
            BUDGET,
        ), (site, it)
        assert (it["feature-bound"], it["max-rows"], it["min-rows"]) == (
            BOUNDS["feature-bound"],
            BOUNDS["max-rows"],
            MIN_ROWS,
        ), (site, it)
        assert it["threshold"] == secure["threshold"] == 2 and it["colluders"] == 0, (site, it)
        assert it["noise"][block] > 0 and 0 < it["spent"] <= BUDGET, (site, it)
    for name, std in privacy["noise"].items():  # independent noise: variances add
        assert std == pytest.approx(math.sqrt(sum(it["noise"][name] ** 2 for it in said.values())))
    return said


def test_a_secure_kd_run_with_noise(deployment, runs, federation, reference):
    """KD avg of both models, each within six noise stds (and its rounding bound) of
    ``distrank score``'s; every site attests the noise its policy made it add."""
    net, *_ = deployment
    run, out = runs["kd"]
    assert run["status"] == "finished:completed", (run, net.tail("superlink"))
    assert run["fab-hash"] == supernode.default_pin()  # the FAB every site pinned
    merged = scored(out, reference, federation[1], "kd")
    assert set(zip(merged.metric, merged.aggregation)) == {("kd", "avg")}
    error = (merged.value - merged.value_score).abs()
    assert (error <= merged.bound + 6 * merged.noise_std).all(), merged
    attested(out, "kd")


def test_a_secure_sketch_run_with_noise(deployment, runs, federation, reference):
    """KD of the pooled sketch within six noise stds of ``distrank score``'s: the table
    holds it unbiased, the noise's own excess (dim noise_std^2 n / (n - 1), the same for
    every model: ``sketch._maps.sketch_kd``) taken off and the raw value kept in the meta;
    the pooled sketch covers the sites' rows, up to the noise on n."""
    net, *_ = deployment
    run, out = runs["sketch"]
    assert run["status"] == "finished:completed", (run, net.tail("superlink"))
    merged = scored(out, reference, federation[1], "kd_sketch")
    assert set(zip(merged.metric, merged.aggregation)) == {("kd_sketch", "all")}
    pooled = sk.load(sketch_path(out))
    assert np.isfinite(pooled.mean).all() and pooled.noise_std > 0
    bias = pooled.meta["dim"] * pooled.noise_std**2 * pooled.n / (pooled.n - 1)
    error = (merged.value - merged.value_score).abs()
    assert (error <= merged.bound + 6 * merged.noise_std).all(), (merged, bias)
    raw = json.loads(meta_path(out).read_text())["sketch"]["raw"]
    by_model = dict(zip(merged.model, merged.value))
    for row in raw:
        assert row["value"] - by_model[row["model"]] == pytest.approx(bias, rel=1e-9)
    said = attested(out, "sketch")
    rows = math.sqrt(sum(it["noise"]["rows"] ** 2 for it in said.values()))
    assert abs(pooled.n - sum(len(x) for x in federation[0].values())) <= 6 * rows + 1


def test_each_site_ledger_records_each_release_within_its_budget(deployment, runs):
    """One entry per noised run, in the order the site spent them; the epsilon spent
    composes (Gaussian releases: one of multiplier (sum z^-2)^-1/2), the first release
    spends the site's own epsilon, and each run's meta says what the site spent then."""
    net, *_ = deployment
    ids = {int(run["run-id"]): name for name, (run, _) in runs.items()}
    for site in SITES:
        lines = (net.root / f"{site}.ledger.jsonl").read_text().splitlines()
        entries = [json.loads(line) for line in lines]
        assert sorted(e["run"] for e in entries) == sorted(ids), entries
        assert {ids[e["run"]]: e["what"] for e in entries} == {
            "kd": ["kd"],
            "sketch": ["kd_sketch"],
        }, entries
        assert entries[0]["spent"] == pytest.approx(EPSILON, rel=1e-6), entries
        zs = [e["z"] for e in entries]
        total = sum(z**-2 for z in zs) ** -0.5
        composed = epsilon_spent(noise_multiplier=total, n_releases=1, delta=DELTA)
        assert entries[1]["spent"] == pytest.approx(composed, rel=1e-9), entries
        assert EPSILON < composed <= BUDGET, entries
        for entry in entries:
            _, out = runs[ids[entry["run"]]]
            meta = json.loads(meta_path(out).read_text())
            assert meta["secure"]["attested"][site]["spent"] == pytest.approx(entry["spent"])
