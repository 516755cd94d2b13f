"""Secure mode without a network: the real SecAggPlusWorkflow and secaggplus_mod, the
ServerApp's and the ClientApp's own code, messages passed in-process by a grid that
records every message the server receives (what a server learns is in there)."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.common.secure_aggregation.quantization import quantize
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from distrank.flower import site as site_app
from distrank.flower.federation import RUN_CONFIG
from distrank.flower.identity import new_key
from distrank.flower.secure import plan as secure
from distrank.flower.server import main as server_main

STAGES = ["query", *Stage.all(), "never"]
BOUND = 12.0  # > every row norm of the conftest features (max ~8.5)
#: a request's scorer options: KD through the rbf kernel of bandwidth 3, in float64
RBF_KD = {
    "metrics": ["kd"],
    "kernel": "rbf",
    "kernel_params": {"bandwidth": 3.0},
    "kd_estimator": "unbiased",
    "n_subsets": 100,
    "subset_size": 1000,
    "seed": 0,
    "pr_k": 3,
    "dc_k": 5,
    "dtype": "float64",
}


def stage_of(msg: Message) -> str:
    configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
    return "query" if configs is None else str(configs[Key.STAGE])


class RecordingGrid:
    """Nodes that run the site's ClientApp in-process, each with its own Context (its state
    persists across messages, as on a SuperNode). ``received`` is every message the server
    gets, with the stage of the request it answers; a node in ``silent`` stops answering
    from that stage on; ``tamper(stage, message)`` may rewrite what the server sends (a
    server that deviates from the protocol)."""

    def __init__(self, node_configs: dict[int, dict], silent=None, tamper=None):
        self.contexts = {
            node: Context(1, node, config, RecordDict(), {})
            for node, config in node_configs.items()
        }
        self.silent, self.tamper, self.sent, self.received = silent or {}, tamper, {}, []

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            if self.tamper is not None:
                self.tamper(stage_of(msg), msg)
            self.sent[msg.metadata.message_id] = msg
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        out = []
        for mid in message_ids:
            msg = self.sent[mid]
            node, stage = msg.metadata.dst_node_id, stage_of(msg)
            if stage in STAGES[STAGES.index(self.silent.get(node, "never")) :]:
                continue
            del self.sent[mid]
            try:  # a copy, as if it travelled (secaggplus_mod pops from what it gets)
                reply = site_app.app(copy.deepcopy(msg), self.contexts[node])
            except Exception as err:  # the SuperNode sends a ClientApp's exception as an error
                reply = Message(Error(0, f"{type(err).__name__}: {err}"), reply_to=msg)
            self.received.append((stage, reply))
            out.append(reply)
        return out

    def site_of(self, node: int):
        return self.contexts[node].node_config["site-id"]

    def errors(self) -> list[tuple[str, str]]:
        """(stage, text) of every failure the server received: round-1 error fields and
        the reasons of error messages."""
        out = []
        for stage, msg in self.received:
            if msg.has_error():
                out.append((stage, msg.error.reason))
            elif stage == "query" and (text := msg.content.config_records["site"]["error"]):
                out.append((stage, text))
        return out


def save(tmp_path: Path, arrays: dict[str, np.ndarray]) -> dict[str, Path]:
    paths = {}
    for name, x in arrays.items():
        paths[name] = tmp_path / f"{name}.npz"
        np.savez(paths[name], features=x)
    return paths


def pin_keys(root: Path, sites) -> Path:
    """Each site's long-term key at ``root/<site>.key`` and the peers file pinning them all."""
    peers = root / "peers.json"
    peers.write_text(json.dumps({s: new_key(root / f"{s}.key") for s in sites}))
    return peers


def secure_setup(tmp_path, sites, models, *, node=None, silent=None, tamper=None, **config):
    """(grid, run config) of a secure run over ``sites`` (name -> features; node ids 100,
    101, ...). ``node`` adds keys to every site's node config (default: share-stats,
    device cpu, min-sites the number of sites up to 3, the run's bounds, a long-term key
    per site and the peers file pinning them); ``config`` to the run config."""
    files = save(tmp_path, {**sites, **models})
    base = {"share-stats": True, "device": "cpu", "min-sites": min(3, len(sites))}
    base |= {"feature-bound": BOUND, "max-rows": 1000, "peers": str(pin_keys(tmp_path, sites))}
    nodes = {
        100 + i: {
            "site-id": s,
            "features": str(files[s]),
            "signing-key": str(tmp_path / f"{s}.key"),
        }
        | base
        | (node or {})
        for i, s in enumerate(sites)
    }
    run_config = RUN_CONFIG | secure.SECURE_CONFIG
    run_config |= {
        "models": ",".join(f"{m}={files[m]}" for m in models),
        "sites": ",".join(sites),
        "out": str(tmp_path / "scores.csv"),
        "metrics": "kd,fd,recall",
        "dtype": "float64",
        "secure": True,
        "feature-bound": BOUND,
        "max-rows": 1000,
        "timeout": 1.0,
    } | config
    return RecordingGrid(nodes, silent, tamper), run_config


def run(grid: RecordingGrid, run_config: dict) -> Path:
    """The ServerApp's main on ``grid``: the table it wrote."""
    server_main(grid, Context(1, 1, {}, RecordDict(), run_config))
    return Path(run_config["out"])


def run_secure(tmp_path, sites, models, **kwargs) -> tuple[RecordingGrid, Path]:
    grid, run_config = secure_setup(tmp_path, sites, models, **kwargs)
    return grid, run(grid, run_config)


def site_integers(sites, models) -> dict[str, np.ndarray]:
    """Each site's vector as the integers Flower's quantiser makes of it (the plan of
    the secure runs here: kd and recall, FD shared, the conftest's d = 6)."""
    from distrank.flower.federation import RunSettings
    from distrank.flower.secure.site import site_vector

    settings = RunSettings.from_run_config(
        RUN_CONFIG | {"models": "a=/a.npz", "sites": "x,y", "out": "/o.csv", "dtype": "float64"}
    )
    options = settings.options | {"metrics": ["kd", "fd", "recall"]}
    k_max = secure.kernel_bound("poly", {}, 6, BOUND)
    plan = secure.Plan(tuple(models), ("kd", "fd", "recall"), 6, "size", BOUND, 1000, k_max)
    centre = secure.public_centre(models)
    return {
        name: np.rint(
            (secure.encode(site_vector(x, models, options, plan, centre), plan) + 1) * 2**29
        ).astype(np.int64)
        for name, x in sites.items()
    }


def private_masks_removed(grid: RecordingGrid, generator) -> dict:
    """What a server that follows the protocol holds of each site once it removes the
    private mask, whose seed unmasking hands it: site -> [factor, vector] mod 2^40 (the
    site's vector under its pairwise masks). ``generator`` expands seeds to masks."""
    from flwr.common import bytes_to_ndarray
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares

    masked, shares = {}, {}
    for stage, msg in grid.received:
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS) if not msg.has_error() else {}
        if stage == Stage.COLLECT_MASKED_VECTORS and configs:
            arrays = [bytes_to_ndarray(b) for b in configs[Key.MASKED_PARAMETERS]]
            masked[msg.metadata.src_node_id] = arrays
        elif stage == Stage.UNMASK and configs:
            for owner, piece in zip(configs[Key.NODE_ID_LIST], configs[Key.SHARE_LIST]):
                shares.setdefault(owner, []).append(piece)
    out = {}
    for node, arrays in masked.items():
        seed = combine_shares(shares[node])
        private = generator(seed, secure.MODULUS, [a.shape for a in arrays])
        out[grid.site_of(node)] = [(a - m) % secure.MODULUS for a, m in zip(arrays, private)]
    return out


def flower_sum(vectors: list[np.ndarray], plan: secure.Plan) -> np.ndarray:
    """What SecAggPlusWorkflow hands over for these sites' vectors, masks aside: each
    site's vector through Flower's own quantiser (with its weight factor), the integer
    sum, and the workflow's dequantisation (``unmask_stage``)."""
    quantised = []
    for v in vectors:
        (z,) = quantize([secure.encode(v, plan)], 1.0, secure.LEVELS)
        quantised.append(z.astype(np.int64))
    k, total = len(vectors), sum(quantised)
    return (total * (2.0 / secure.LEVELS) - 1.0 - (k - 1)) * (secure.LEVELS / (k * secure.LEVELS))
