"""Secure mode without a network: the real SecAggPlusWorkflow and secaggplus_mod, the
ServerApp's and the ClientApp's own code, messages passed in-process by a grid that
records every message the server receives."""

from __future__ import annotations

import copy
import logging
import math
import re
import uuid
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from flwr.app import Context, Error, Message, RecordDict
from flwr.client.mod.secure_aggregation.secaggplus_mod import SecAggPlusState
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.quantization import quantize
from flwr.common.secure_aggregation.secaggplus_constants import (
    RECORD_KEY_CONFIGS,
    RECORD_KEY_STATE,
    Key,
    Stage,
)
from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
from flwr.supercore.task_identity import TaskIdentity

from distrank.flower import secure
from distrank.flower import site as site_app
from distrank.flower.server import RUN_CONFIG, FederationError, RunSettings
from distrank.flower.server import main as server_main
from distrank.metrics import score
from distrank.metrics.fd import GaussianStats, frechet_distance, gaussian_stats

KEY = ["model", "metric", "aggregation", "client"]
BOUND = 12.0  # > every row norm of the conftest features (max ~8.5)


@pytest.fixture
def server_process(monkeypatch):
    """The identity Flower gives a ServerApp process (messages are stamped with it)."""
    for attr, value in (("_run_id", 1), ("_node_id", 1), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value)


class RecordingGrid:
    """Nodes that run the site's ClientApp in-process, each with its own Context (its state
    persists across messages, as on a SuperNode). ``received`` is every message the server
    gets, with the stage of the request it answers; a node in ``silent`` stops answering from that SecAgg+ stage on."""

    def __init__(self, node_configs: dict[int, dict], silent: dict[int, str] | None = None):
        self.contexts = {
            node: Context(1, node, config, RecordDict(), {})
            for node, config in node_configs.items()
        }
        self.silent, self.sent, self.received = silent or {}, {}, []

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
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


STAGES = ["query", *Stage.all(), "never"]


def stage_of(msg: Message) -> str:
    configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
    return "query" if configs is None else str(configs[Key.STAGE])


@pytest.fixture
def files(tmp_path, federation):
    sites, models = federation
    paths = {}
    for name, x in {**sites, **models}.items():
        paths[name] = tmp_path / f"{name}.npz"
        np.savez(paths[name], features=x)
    return paths


def run_secure(tmp_path, files, federation, *, silent=None, share=True, **config):
    """The ServerApp's main in secure mode on a RecordingGrid of the three sites."""
    sites, models = federation
    nodes = {
        100 + i: {"site-id": s, "features": str(files[s]), "share-stats": share, "device": "cpu"}
        for i, s in enumerate(sites)
    }
    grid = RecordingGrid(nodes, silent)
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
    server_main(grid, Context(1, 1, {}, RecordDict(), run_config))
    return grid, tmp_path / "scores.csv"


def test_the_secure_table_equals_score_within_its_bounds(
    tmp_path, files, federation, reference, server_process
):
    page = tmp_path / "report.html"
    _, out = run_secure(tmp_path, files, federation, report=str(page))
    table = pd.read_csv(out, keep_default_na=False)
    bounds = pd.read_csv(secure.bounds_path(out))
    assert "Scores per model: all and avg" in re.findall(r"<h2[^>]*>(.*?)</h2>", page.read_text())
    assert set(zip(table.metric, table.aggregation)) == {
        ("kd", "avg"),
        ("recall", "avg"),
        ("fd", "all"),
    }
    assert (table.client == "").all() and len(table) == 6
    expected = score(*reference, federation[1], metrics=["kd", "fd", "recall"], dtype="float64")
    merged = table.merge(expected, on=KEY, suffixes=("", "_score")).merge(
        bounds, on=["model", "metric", "aggregation"]
    )
    assert len(merged) == 6
    error = (merged.value - merged.value_score).abs()
    assert (error <= merged.bound).all(), merged
    kd = merged[merged.metric == "kd"]
    assert (kd.bound < 1e-9 * kd.value_score.abs()).all()  # a bound that means something
    for metric in ("kd", "fd", "recall"):
        ours, theirs = (
            merged[merged.metric == metric].sort_values(col).model.tolist()
            for col in ("value", "value_score")
        )
        assert ours == theirs


def site_integers(sites, models) -> dict[str, np.ndarray]:
    """Each site's vector as the integers Flower's quantiser makes of it (the plan of
    the secure runs here: kd and recall, FD shared, d = 6)."""
    settings = RunSettings.from_run_config(
        RUN_CONFIG | {"models": "a=/a.npz", "sites": "x,y", "out": "/o.csv", "dtype": "float64"}
    )
    options = settings.options | {"metrics": ["kd", "fd", "recall"]}
    plan = secure.Plan(tuple(models), ("kd", "recall"), True, 6, "size", BOUND, 1000, 0.0)
    plan = secure.Plan(**(vars(plan) | {"kernel_bound": secure.kernel_bound("poly", {}, 6, BOUND)}))
    centre = secure.public_centre(models)
    return {
        name: np.rint(
            (secure.encode(secure.site_vector(x, models, options, plan, centre), plan) + 1) * 2**29
        ).astype(np.int64)
        for name, x in sites.items()
    }


def test_the_server_sees_masked_vectors_and_the_sum_only(
    tmp_path, files, federation, server_process
):
    """Every message the server receives: round 1 says only who is ready; SecAgg+ brings
    public keys, encrypted shares, masked vectors and the private-mask seeds of the sites
    whose vectors it holds. Removing all it can, the server is left with each site's
    vector under the pairwise masks, which only add up to zero over the sites."""
    sites, models = federation
    grid, _ = run_secure(tmp_path, files, federation)
    node_site = {node: ctx.node_config["site-id"] for node, ctx in grid.contexts.items()}
    encoded = site_integers(sites, models)
    by_stage: dict[str, list[Message]] = {}
    for stage, msg in grid.received:
        assert not msg.has_error(), msg.error
        by_stage.setdefault(stage, []).append(msg)
    assert {k: len(v) for k, v in by_stage.items()} == dict.fromkeys(STAGES[:5], 3)
    for msg in by_stage["query"]:  # round 1: no numbers
        assert not msg.content.array_records
        assert set(msg.content.config_records["site"]) == {"site-id", "fd", "error"}
    masked = {}
    for msg in by_stage[Stage.COLLECT_MASKED_VECTORS]:
        content = msg.content
        assert all(not record for record in content.array_records.values())  # cleared
        assert dict(content.config_records["fitres.metrics"]) == {
            "site-id": node_site[msg.metadata.src_node_id]
        }
        assert content.metric_records["fitres.num_examples"]["num_examples"] == 1  # not n_i
        factor, vector = map(
            bytes_to_ndarray, content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]
        )
        masked[node_site[msg.metadata.src_node_id]] = vector
    shares: dict[int, list[bytes]] = {}
    for msg in by_stage[Stage.UNMASK]:
        record = msg.content.config_records[RECORD_KEY_CONFIGS]
        for owner, piece in zip(record[Key.NODE_ID_LIST], record[Key.SHARE_LIST]):
            shares.setdefault(owner, []).append(piece)
    residual = {}
    for node, ctx in grid.contexts.items():
        state = SecAggPlusState(**ctx.state.config_records[RECORD_KEY_STATE])
        seed = combine_shares(shares[node])
        assert seed == state.rd_seed and seed != state.sk1  # never a site's pairwise key
        shapes = [(1,), encoded[node_site[node]].shape]  # Flower's weight factor, then ours
        _, mask = pseudo_rand_gen(seed, secure.MODULUS, shapes)
        residual[node_site[node]] = (masked[node_site[node]] - mask) % secure.MODULUS
    total = sum(encoded.values())
    assert np.array_equal(sum(residual.values()) % secure.MODULUS, total)  # the sum, exactly
    for name, z in encoded.items():
        left = residual[name]
        assert np.mean(left == z) < 0.01  # the site's vector is not what is left,
        assert np.mean(left <= secure.LEVELS) < 0.05  # nor anything a site could send:
        for other in sites:  # nor its pairwise masks, minus any other site's vector
            assert np.mean((left - encoded[other]) % secure.MODULUS <= secure.LEVELS) < 0.05
    n = encoded["oslo"].shape[0] // 2  # the row counts (first entry) leak nowhere in plain
    assert all(masked[s][0] != encoded[s][0] and masked[s][n] != encoded[s][n] for s in sites)


def test_a_site_dropping_after_key_sharing(
    tmp_path, files, federation, reference, server_process, caplog
):
    sites, models = federation
    dropped = {101: Stage.COLLECT_MASKED_VECTORS}  # paris: keys shared, no vector
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _, out = run_secure(tmp_path, files, federation, silent=dropped, **{"secure-threshold": 2})
    assert "site(s) ['paris'] dropped out: the sum is over ['oslo', 'rome']" in caplog.text
    table = pd.read_csv(out, keep_default_na=False)
    keep = reference[1] != "paris"
    expected = score(
        reference[0][keep],
        reference[1][keep],
        models,
        metrics=["kd", "fd", "recall"],
        dtype="float64",
    )
    merged = table.merge(expected, on=KEY, suffixes=("", "_score")).merge(
        pd.read_csv(secure.bounds_path(out)), on=["model", "metric", "aggregation"]
    )
    assert len(merged) == 6 and ((merged.value - merged.value_score).abs() <= merged.bound).all()
    out.unlink()
    with pytest.raises(FederationError) as err:
        run_secure(tmp_path, files, federation, silent=dropped, **{"secure-threshold": 3})
    assert "halted at the 'collect masked vectors' stage: site(s) ['paris'] dropped out" in str(
        err.value
    )
    assert "unmasking needs 3 of the 3 sites (run config 'secure-threshold')" in str(err.value)
    assert not out.exists()


def test_a_value_outside_its_range_is_an_error_naming_the_setting(
    tmp_path, files, federation, server_process
):
    sharp = {"models": f"sharp={files['sharp']}"}  # rows of norm <= 4.2; paris has 6.2
    with pytest.raises(FederationError) as err:
        run_secure(tmp_path, files, federation, **sharp, **{"feature-bound": 5.0})
    assert str(err.value) == (
        "site 'paris' failed: ValueError: a row of this site has an L2 norm above the run "
        "config's 'feature-bound' 5: raise it"
    )
    with pytest.raises(ValueError, match=r"models\['broad'\]: a row's L2 norm exceeds the run "):
        run_secure(tmp_path, files, federation, **{"feature-bound": 7.0})
    with pytest.raises(FederationError, match="more rows than the run config's 'max-rows' 70"):
        run_secure(tmp_path, files, federation, **{"max-rows": 70})
    with pytest.raises(FederationError, match=r"site\(s\) \['oslo', 'paris', 'rome'\] do not"):
        run_secure(tmp_path, files, federation, share=False)
    assert not (tmp_path / "scores.csv").exists()


def plan_of(**changes) -> secure.Plan:
    base = dict(
        models=("a", "b"),
        metrics=("kd", "recall"),
        fd=True,
        dim=3,
        weights="size",
        feature_bound=2.0,
        max_rows=500,
        kernel_bound=secure.kernel_bound("poly", {}, 3, 2.0),
    )
    return secure.Plan(**(base | changes))


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


def test_the_sum_is_off_by_at_most_k_s_2_pow_minus_60(federation):
    rng = np.random.default_rng(7)
    plan = plan_of()
    scales = secure._entry_scales(plan)
    for k in (2, 3, 17):
        vectors = [rng.uniform(-1, 1, scales.shape) * scales for _ in range(k)]
        vectors[0][:4] = scales[:4]  # the ends of the range
        vectors[1][:4] = -scales[:4]
        got = secure.decode_sum(flower_sum(vectors, plan), k, plan)
        for i in range(len(scales)):
            exact = sum(Fraction(float(v[i])) for v in vectors)
            quant = k * Fraction(float(scales[i])) * Fraction(secure.GRID_ERROR)
            assert abs(Fraction(float(got[i])) - exact) <= quant + abs(exact) * Fraction(1, 2**53)
        (z,) = quantize([secure.encode(vectors[0], plan)], 1.0, secure.LEVELS)
        assert z.min() >= 0 and z.max() <= secure.LEVELS  # Flower's quantiser: exact integers
        assert np.array_equal(z, np.rint((secure.encode(vectors[0], plan) + 1) * 2**29))


def test_encode_refuses_values_outside_the_range_naming_the_setting():
    plan = plan_of()
    scales = secure._entry_scales(plan)
    v = scales / 2
    v[0] = 600.0  # n_i: the range is [-512, 512] (the power of two above max-rows 500)
    with pytest.raises(ValueError, match=r"block 'rows' is outside .* raise 'max-rows'"):
        secure.encode(v, plan)
    v[0], v[4] = 1.0, np.nan  # a recall entry
    with pytest.raises(ValueError, match=r"block 'recall' .* raise 'feature-bound' or 'max-rows'"):
        secure.encode(v, plan)


def test_the_clipping_ranges_come_from_the_public_settings():
    plan = plan_of()
    k_max = (4 / 3 + 1) ** 3  # poly defaults: gamma 1/d, coef0 1, degree 3; |x| <= 2
    assert plan.kernel_bound == pytest.approx(k_max)
    assert secure.kernel_bound("rbf", {"bandwidth": 3.0}, 3, 2.0) == 1.0
    assert secure.kernel_bound("linear", {}, 3, 2.0) == 4.0
    assert plan.scales() == {
        "rows": 512.0,
        "kd": 2.0 ** math.frexp(4 * k_max * 500 * (1 + 2**-10))[1],
        "recall": 512.0,
        "sum": 2048.0,  # 2 F N = 2000
        "scatter": 8192.0,  # 4 F^2 N = 8000
    }
    assert [b[1] for b in plan.blocks()] == [1, 2, 2, 3, 6] and plan.length() == 14
    uniform = plan_of(weights="uniform").scales()
    assert uniform["recall"] == 2.0 and uniform["sum"] == 2048.0
    u = np.array([[2.0, 0.0, 0.0]])  # |KD| <= 4 K is tight: X = {u}, Y = {-u}, biased KD
    kd = score(
        np.repeat(u, 5, 0),
        np.zeros(5, int),
        {"m": -u},
        metrics=["kd"],
        kernel="linear",
        kd_estimator="biased",
        dtype="float64",
    )
    assert kd.value.iloc[0] == 4 * secure.kernel_bound("linear", {}, 3, 2.0) == 16.0


@pytest.mark.parametrize("n,d", [(300, 6), (12, 20)])  # full rank; rank 11 of 20
def test_the_fd_bound_holds_under_the_worst_perturbations(n, d):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 2, d) + 0.5
    y = gaussian_stats(rng.normal(size=(400, d)))
    s1, s2 = x.sum(axis=0), x.T @ x
    exact = GaussianStats(n, s1 / n, (s2 - np.outer(s1, s1) / n) / (n - 1))
    for e in (1e-9, 1e-6, 1e-3):
        e1, e2 = e, e * 10
        bound = secure.fd_bound(exact, y, s1, e1, e2)
        worst = 0.0
        for _ in range(20):
            d1 = e1 * rng.choice([-1.0, 1.0], d)
            d2 = e2 * rng.choice([-1.0, 1.0], (d, d))
            d2 = np.triu(d2) + np.triu(d2, 1).T  # S2 is summed as its upper triangle
            t1, t2 = s1 + d1, s2 + d2
            moved = GaussianStats(n, t1 / n, (t2 - np.outer(t1, t1) / n) / (n - 1))
            worst = max(worst, abs(frechet_distance(moved, y) - frechet_distance(exact, y)))
        assert 0 < worst <= bound


def test_secure_settings_and_what_they_refuse():
    base = RUN_CONFIG | secure.SECURE_CONFIG
    base |= {"models": "a=/a.npz", "sites": "x,y,z", "out": "/o.csv", "metrics": "kd,fd,recall"}
    base |= {"secure": True, "feature-bound": 10}

    def settings(**change):
        config = base | change
        return secure.SecureSettings.from_run_config(config, RunSettings.from_run_config(config))

    assert settings(secure=False) is None
    assert settings() == secure.SecureSettings(10.0, 1000000, 2)  # a majority of 3
    assert settings(**{"secure-threshold": 3}).threshold == 3
    with pytest.raises(ValueError) as err:
        settings(metrics="kd,precision,recall,density")
    assert str(err.value).startswith(
        "run config: metrics ['precision', 'density'] are refused in secure mode: secure mode "
        "writes only what a secure sum"
    )
    assert "nearest-neighbour radii among all sites' rows" in str(err.value)
    for change, match in [
        ({"feature-bound": 0.0}, "secure mode needs 'feature-bound' > 0"),
        ({"feature-bound": float("inf")}, "secure mode needs 'feature-bound' > 0"),
        ({"max-rows": 1}, "'max-rows' must be at least 2"),
        ({"secure-threshold": 4}, r"'secure-threshold' must be 0 \(a majority\) or 2..3, got 4"),
        ({"secure-threshold": 1}, r"'secure-threshold' must be 0 \(a majority\) or 2..3, got 1"),
        ({"secure": "yes"}, "'secure' must be bool"),
        ({"max-rows": 10.0}, "'max-rows' must be int"),
        ({"sites": "x"}, "secure mode needs at least 2 'sites'"),
    ]:
        with pytest.raises(ValueError, match=match):
            settings(**change)
