"""Secure mode under load and faults, on real processes, against plain mode side by side.

One flower-superlink and N SuperNode processes (distrank's, pinned) on 127.0.0.1 (``tests/flower/
loopback.py``). Plain mode runs over every site; then secure mode runs over the same
sites while two die: one when the request for its masked vector arrives (before it
sends it), one when the unmask request arrives (its vector is in). The secure run must
complete, cover exactly the sites whose vectors arrived, name them in its
``.meta.json`` and equal ``distrank score`` over them within the written bounds.

    .venv/bin/python bench/bench_flower.py            # 10 sites (~3-5 min on 2 cores)
    .venv/bin/python bench/bench_flower.py --policy   # the release policy's cost (~1 min)

``--policy`` runs the real ServerApp and ClientApp code in one process (the secure
harness of ``tests/flower/secure_run.py``: SecAgg+ over in-process messages) over the
same sites, a secure KD + Recall run with the sites' policies adding no noise against
the same run with noise (epsilon 1) and a ledger, rounds alternating; and reports what
the policy adds to a site's round-1 reply (the signed attestation: bytes, signing time)
and to its work (the policy check, the ledger's locked, fsynced append).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "flower"))

from loopback import PINNED, Loopback  # noqa: E402
from secure_run import pin_keys  # noqa: E402

from distrank.metrics import score  # noqa: E402

TRAIN = "Receiving: train message"  # a SuperNode's log line per SecAgg+ stage it receives


def kill_at(net: Loopback, site: str, nth: int, done: threading.Event) -> None:
    """Kill ``site``'s SuperNode when its ``nth`` SecAgg+ request arrives (3: the masked
    vector's, 4: unmasking's); a ClientApp takes over a second to start, so it dies first."""
    log = net.logs[site]
    before = log.read_text().count(TRAIN)
    while not done.is_set():
        if log.read_text().count(TRAIN) - before >= nth:
            net.kill(site, signal.SIGKILL)
            return
        time.sleep(0.05)


def federation(k: int, d: int) -> tuple[dict, dict]:
    """k sites of 150, 170, ... rows with shifted means, and three models."""
    rng = np.random.default_rng(29)
    sites = {f"s{i}": rng.normal(size=(150 + 20 * i, d)) + 0.2 * i for i in range(k)}
    models = {f"m{j}": rng.normal(0.1 * j, 1 + 0.2 * j, size=(200, d)) for j in range(3)}
    return sites, models


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, default=10)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--timeout", type=float, default=90.0)
    p.add_argument("--policy", action="store_true", help="the release policy's cost, in-process")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    sites, models = federation(args.sites, args.dim)
    if args.policy:
        policy_cost(sites, models, args.rounds)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        peers = pin_keys(root, sites)  # each site's long-term key, pinned by all
        extra = {
            s: f'signing-key="{root / s}.key" peers="{peers}" feature-bound=64.0 max-rows=1000'
            for s in sites
        }
        net, base = Loopback.of_arrays(root, sites, models, supernode=PINNED, extra=extra)
        base |= {
            "metrics": "kd,fd,recall",
            "dtype": "float64",
            "timeout": args.timeout,
        }
        try:
            plain = timed(net, base | {"out": str(root / "plain.csv")})
            out = root / "secure.csv"
            secure = {"secure": True, "feature-bound": 64.0, "max-rows": 1000, "out": str(out)}
            # s2 dies before it sends its vector, s6 while the server unmasks
            secured = timed(net, base | secure, dying={"s2": 3, "s6": 4})
        finally:
            net.close()
        check(out, sites, models, sorted(s for s in sites if s != "s2"))
    print(f"\n{args.sites} loopback sites, d = {args.dim}, {len(models)} models")
    print("| run | wall (s) |\n|---|---:|")
    print(f"| plain, all sites | {plain:.1f} |")
    print(f"| secure, s2 dies before its vector, s6 while unmasking | {secured:.1f} |")
    print(f"| ratio secure / plain | {secured / plain:.2f} |")


def timed(net: Loopback, config: dict, dying: dict | None = None) -> float:
    """Seconds from ``flwr run`` to the run's end, killing each site of ``dying`` at its
    nth SecAgg+ request; the run must complete."""
    done = threading.Event()
    killers = [
        threading.Thread(target=kill_at, args=(net, s, n, done)) for s, n in (dying or {}).items()
    ]
    start = time.perf_counter()
    run_id = net.run(config)
    for t in killers:
        t.start()
    run = net.wait_finished(run_id, 1800)
    seconds = time.perf_counter() - start
    done.set()
    assert run["status"] == "finished:completed", run
    return seconds


def check(out: Path, sites: dict, models: dict, kept: list[str]) -> None:
    """The secure table covers ``kept`` and equals ``distrank score`` on them within its bounds."""
    meta = json.loads(out.with_name(out.name + ".meta.json").read_text())["secure"]
    assert meta["sites"] == kept and meta["dropped"] == ["s2"], meta
    x = np.concatenate([sites[s] for s in kept])
    labels = np.repeat(kept, [len(sites[s]) for s in kept])
    expected = score(x, labels, models, metrics=["kd", "fd", "recall"], dtype="float64")
    table = pd.read_csv(out, keep_default_na=False)
    merged = table.merge(expected, on=["model", "metric", "aggregation", "client"]).merge(
        pd.read_csv(out.with_name("secure.bounds.csv")), on=["model", "metric", "aggregation"]
    )
    error = (merged.value_x - merged.value_y).abs()
    assert len(merged) == 3 * len(models) and (error <= merged.bound).all(), merged
    print(
        f"the sums cover {kept}; max |secure - plain| / bound = {(error / merged.bound).max():.3g}"
    )


def policy_cost(sites: dict, models: dict, rounds: int) -> None:
    """Median wall of a secure run without and with the sites' noise and ledger, and the
    parts the policy adds (module doc)."""
    import statistics

    from flwr.supercore.task_identity import TaskIdentity
    from secure_run import run, secure_setup

    for attr in ("_run_id", "_node_id", "_task_id"):  # as a ServerApp process has them
        setattr(TaskIdentity, attr, 1)
    noise = {"noise-epsilon": 1.0, "noise-delta": 1e-5}
    run_config = {"metrics": "kd,recall", "kernel": "rbf", "kernel-params": "bandwidth=4"}
    walls: dict[str, list[float]] = {"no noise": [], "noise + ledger": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name, node in (("no noise", {}), ("noise + ledger", noise)):
                root = Path(tmp) / f"{name}{r}"
                root.mkdir()
                node = node | ({"ledger": str(root / "site.ledger")} if node else {})
                grid, config = secure_setup(
                    root, sites, models, node=node, **run_config, **noise, timeout=60.0
                )
                start = time.perf_counter()
                run(grid, config)
                walls[name].append(time.perf_counter() - start)
        parts = policy_parts(grid, Path(tmp))
    plain, noisy = (statistics.median(v) for v in walls.values())
    print(
        f"\n{len(sites)} sites in one process, d = {next(iter(sites.values())).shape[1]}, "
        f"{len(models)} models, {rounds} rounds each"
    )
    print("| | value |\n|---|---:|")
    print(f"| secure run, sites add no noise (median s) | {plain:.2f} |")
    print(f"| secure run, noise and a ledger (median s) | {noisy:.2f} |")
    print(f"| ratio | {noisy / plain:.2f} |")
    for what, value in parts.items():
        print(f"| {what} | {value} |")


def policy_parts(grid, tmp: Path) -> dict[str, str]:
    """What the policy adds to a site's round-1 reply and work, from ``grid``'s last run."""
    from flwr.common.serde import recorddict_to_proto

    from distrank.flower.ledger import Ledger
    from distrank.flower.node import SiteConfig
    from distrank.flower.secure.site import attestation

    reply = next(m for stage, m in grid.received if stage == "query").content
    attested = reply.config_records["attested"]
    with_record = len(recorddict_to_proto(reply).SerializeToString())
    del reply.config_records["attested"]
    without = len(recorddict_to_proto(reply).SerializeToString())
    site = SiteConfig.from_node_config(next(iter(grid.contexts.values())).node_config)
    content = {"path": "secure", "noise": {"kd": 1.0}} | site.policy.summary()
    start = time.perf_counter()
    for _ in range(200):
        attestation(site, 1, 100, content)
    sign = (time.perf_counter() - start) / 200
    ledger = Ledger(tmp / "bench.ledger", float("inf"), 1e-5)
    start = time.perf_counter()
    for i in range(200):
        ledger.record(i, 10.0, path="secure")
    spend = (time.perf_counter() - start) / 200
    return {
        "round-1 reply bytes without / with the signed attestation": f"{without} / {with_record}",
        "attestation: content, signature bytes": f"{len(attested['content'])}, "
        f"{len(attested['signed'][1])}",
        "attestation (load the key, sign) per reply": f"{sign * 1e3:.2f} ms",
        "ledger spend (lock, check, append, fsync)": f"{spend * 1e3:.2f} ms",
    }


if __name__ == "__main__":
    main()
