"""An auditor that plays many server plans against a site, on neighbouring datasets.

For each plan -- random and adversarial: kernels and their parameters, bandwidths,
estimators, weights, metric lists, models at and past the feature bound, FD centres,
thresholds, ranges, on each path (secure sums, plain scores, plain sketches) -- and a
random site policy, the auditor builds site datasets X and neighbours X' that differ in
one row (the worst-case row within the bounds, found by search) and checks that

1. the site's answer through its real entry point (``secure.site.prepare``,
   ``site.score_site``) is the same refusal, or the same acceptance, for X and X';
2. every release the site accepts with noise moves, block by block, by at most the
   sensitivity the site used for its noise (before noise: the release is the noiseless
   value plus noise calibrated to that sensitivity).

The largest movement over sensitivity seen is printed (the search comes close to the
bounds where they are tight: rbf KD under size weights, Recall, the sketch).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from secure_run import pin_keys

from distrank.flower.messages import encode_request
from distrank.flower.node import SiteConfig
from distrank.flower.policy import Policy, Refused
from distrank.flower.secure import plan as secure
from distrank.flower.secure import site as secure_site
from distrank.flower.site import plain_sensitivities, score_site
from distrank.metrics import score_client
from distrank.metrics._options import score_options
from distrank.metrics.sketch._family import feature_map

D = 4  # feature dimension
F = 3.0  # the sites' feature bound
PLANS = 240  # plans played (80 per path)
SEARCH = 12  # hill-climbing steps of the worst-case row search


def unit(rng, d=D) -> np.ndarray:
    v = rng.normal(size=d)
    return v / np.linalg.norm(v)


def random_policy(rng) -> Policy:
    return Policy(
        plain=("scores", "sketch"),
        share_stats=bool(rng.integers(2)),
        feature_bound=F,
        max_rows=int(rng.choice([12, 40])),
        min_rows=int(rng.integers(3, 7)),
        min_sites=2,
        epsilon=float(rng.choice([0.0, 1.0, 1.0, 1.0, 5.0])),
        delta=1e-5,
        noise_kernels=("rbf", "laplace")
        if rng.random() < 0.3
        else ("rbf", "laplace", "linear", "poly"),
        bandwidth=(0.0, math.inf) if rng.random() < 0.8 else (1.0, 2.0),
        colluders=int(rng.integers(0, 2)),
        rows=str(rng.choice(["", "public"])),
    )


def random_models(rng, policy) -> dict:
    """1-3 models of 6-10 rows; some rows exactly at the bound, some adversarially
    placed (all at one point), sometimes one row past it (a request to refuse)."""
    models = {}
    for g in range(int(rng.integers(1, 4))):
        y = rng.normal(size=(int(rng.integers(6, 11)), D))
        kind = rng.integers(3)
        if kind == 0:  # at the bound
            y = F * y / np.linalg.norm(y, axis=1, keepdims=True)
        elif kind == 1:  # one point on the sphere
            y = np.tile(F * unit(rng), (len(y), 1))
        else:
            y *= F / 3 / max(1.0, np.linalg.norm(y, axis=1).max() / 3)
        models[f"m{g}"] = y
    if rng.random() < 0.05:
        models["m0"][0] = 1.1 * F * unit(rng)
    return models


def random_options(rng, metrics) -> dict:
    kernel = str(rng.choice(["rbf", "rbf", "rbf", "laplace", "linear", "poly"]))
    params = {}
    if kernel in ("rbf", "laplace"):
        params = {"bandwidth": float(rng.choice([0.2, rng.uniform(0.3, 4.0)]))}
    elif kernel == "poly":
        params = {"degree": int(rng.integers(1, 4)), "gamma": float(rng.uniform(0.05, 1))}
        params["coef0"] = float(rng.uniform(-1, 1))
    return {
        "metrics": list(metrics),
        "kernel": kernel,
        "kernel_params": params,
        "kd_estimator": str(rng.choice(["unbiased"] * 4 + ["biased"] * 3 + ["subsets"])),
        "n_subsets": 5,
        "subset_size": 3,
        "seed": int(rng.integers(5)),
        "pr_k": 2,
        "dc_k": 2,
        "dtype": "float64",
    }


def random_dataset(rng, policy, models) -> np.ndarray:
    """min-rows to 1.5 max-rows rows: random in the ball, all at one point (next to a
    model, or opposite it), or partly outside the ball (clipped by the site)."""
    n = int(rng.integers(policy.min_rows, int(1.5 * policy.max_rows) + 1))
    kind = rng.integers(4)
    if kind <= 1:
        y = next(iter(models.values()))
        p = y[0] if rng.random() < 0.5 else -y[0]
        return np.tile(p, (n, 1)) + 1e-3 * rng.normal(size=(n, D))
    x = rng.normal(size=(n, D))
    return x * (F / 2 if kind == 1 else F)


class Site:
    """One site of the audit: its files, and its answers through the real entry points."""

    def __init__(self, root):
        self.root = root
        self.peers = pin_keys(root, ["s"])

    def config(self, policy, x) -> SiteConfig:
        path = self.root / "x.npz"
        np.savez(path, features=x)
        return SiteConfig("s", path, policy, "cpu", self.root / "s.key", self.peers)

    def answer(self, path, policy, request, x) -> str:
        """The site's reply to ``request`` as the server reads it: its error ("" if none)."""
        site = self.config(policy, x)
        if path == "secure":
            content = secure_site.prepare(site, request, Context(1, 7, {}, RecordDict(), {}))
            record = content.config_records["site"]
            return f"{record['error']}|moments={record['moments']}"
        return str(score_site(site, request).config_records["site"]["error"])


def secure_request(rng, policy, models):
    metrics = [m for m, p in (("kd", 0.8), ("recall", 0.5), ("fd", 0.15)) if rng.random() < p]
    metrics = metrics or ["kd"]
    options = random_options(rng, metrics)
    plan_bound = F if rng.random() < 0.95 else 0.9 * F
    k_max = secure.kernel_bound(options["kernel"], options["kernel_params"], D, F)
    room = (("kd", 1e9), ("recall", 1e9), ("rows", 1e9), ("sum", 1e9), ("scatter", 1e9))
    plan = secure.Plan(
        tuple(models),
        tuple(metrics),
        D,
        str(rng.choice(["size", "uniform"])),
        plan_bound,
        policy.max_rows if rng.random() < 0.95 else policy.max_rows - 1,
        k_max,
        room=room if rng.random() < 0.95 else (("kd", 1e-6),),
        threshold=int(rng.integers(2, 4)),
    )
    centre = F * unit(rng) * (rng.uniform(0, 1) if rng.random() < 0.95 else 1.2)
    request = secure.encode_secure_request(models, options, plan, centre)
    return options, plan, centre, request


def secure_release(policy, options, plan, models, centre, x):
    """(block -> sensitivity, block -> the noiseless released entries) or Refused."""
    stds, sens, _ = secure_site.check_plan(policy, plan, models, options, centre)
    if plan.moments and not policy.share_stats:
        raise Refused("no moments")
    vector = secure_site.site_vector(policy.clip(x), models, options, plan, centre, "cpu")
    return (sens if stds else {}), secure.split(vector, plan)


def plain_release(policy, options, models, x, path):
    opts = score_options(options)
    policy.allow(path, opts.metrics)
    bounds = policy.bounds(opts, D, models)
    kept = policy.clip(x)
    if path == "sketch":
        made = feature_map(opts, D).sketch(kept)
        return ({"sketch": 2.0} if policy.noisy else {}), {"sketch": made.n * made.mean}
    sens = plain_sensitivities(opts, bounds, models) if policy.noisy else {}
    policy.stds(sens)  # refuses a block without a bound under noise
    scores = score_client(kept, models, opts, device="cpu")
    return sens, {m: np.array([scores[g][m] for g in models]) for m in opts.metrics}


def movement(release, x, row) -> float:
    """max over blocks of |release(X) - release(X')| / sensitivity, X' = X with row 0
    replaced by ``row``."""
    sens, a = release(x)
    x2 = x.copy()
    x2[0] = row
    _, b = release(x2)
    return max(np.linalg.norm(a[k] - b[k]) / s for k, s in sens.items())


def worst_row(rng, release, x, models) -> tuple[np.ndarray, float]:
    """The replacement of row 0 that moves the release most: candidates (the axes, the
    opposite of row 0, the models' rows and their opposites, each at radius F, and
    points far outside the ball), then a hill climb from the best."""
    candidates = [F * s * e for e in np.eye(D) for s in (1, -1)]
    candidates += [-F * x[0] / max(np.linalg.norm(x[0]), 1e-12), 5 * F * unit(rng)]
    for y in models.values():
        candidates += [F * y[0] / np.linalg.norm(y[0]), -F * y[0] / np.linalg.norm(y[0])]
    scored = [(movement(release, x, c), c) for c in candidates]
    best, row = max(scored, key=lambda t: t[0])
    for step in range(SEARCH):
        trial = row + (F / (2 + step)) * unit(rng)
        trial *= min(1.0, F / np.linalg.norm(trial))
        got = movement(release, x, trial)
        if got > best:
            best, row = got, trial
    return row, best


def random_plan(rng, path):
    """(policy, models, the request, the release function of a dataset) of one plan."""
    policy = random_policy(rng)
    models = random_models(rng, policy)
    if path == "secure":
        options, plan, centre, request = secure_request(rng, policy, models)

        def release(x):
            return secure_release(policy, options, plan, models, centre, x)

        return policy, models, request, release
    if path == "sketch":  # mostly rbf, the sketch's kernel
        options = random_options(rng, ["kd_sketch"])
        kernel = "rbf" if rng.random() < 0.9 else "laplace"
        options |= {"kernel": kernel, "kernel_params": {"bandwidth": rng.uniform(0.3, 3)}}
        sent = {}
    else:
        metrics = [
            m for m, p in (("kd", 0.8), ("recall", 0.5), ("precision", 0.1)) if rng.random() < p
        ]
        options, sent = random_options(rng, metrics or ["kd"]), models

    def release(x):
        return plain_release(policy, options, sent, x, path)

    return policy, models, encode_request(sent, options), release


@pytest.mark.parametrize("path", ["secure", "scores", "sketch"])
def test_every_plan_moves_a_release_by_at_most_its_sensitivity_and_refuses_alike(path, tmp_path):
    rng = np.random.default_rng({"secure": 48, "scores": 49, "sketch": 50}[path])
    site, start = Site(tmp_path), time.perf_counter()
    counts = {"plans": 0, "accepted": 0, "noised": 0, "refused": 0, "pairs": 0}
    worst: dict[str, float] = {}
    reasons: dict[str, int] = {}
    for _ in range(PLANS // 3):
        policy, models, request, release = random_plan(rng, path)
        counts["plans"] += 1
        x = random_dataset(rng, policy, models)
        try:
            sens, _ = release(x)
        except (Refused, ValueError) as err:
            sens = None
            reasons[str(err)[:40]] = reasons.get(str(err)[:40], 0) + 1
        if sens:  # a noised release: search the worst neighbour, check its movement
            row, moved = worst_row(rng, release, x, models or {"x": x})
            counts["noised"] += 1
            options = dict(request.config_records["options"])
            key = f"{path}:{options['kernel']}:{options['kd_estimator']}"
            worst[key] = max(worst.get(key, 0.0), moved)
            assert moved <= 1 + 1e-9, (key, moved, policy)
        else:
            row = F * unit(rng)
        neighbour = x.copy()
        neighbour[0] = row
        answers = [site.answer(path, policy, request, v) for v in (x, neighbour)]
        assert answers[0] == answers[1], (answers, policy)
        counts["pairs"] += 1
        counts["accepted" if sens is not None else "refused"] += 1
    wall = time.perf_counter() - start
    print(f"\naudit {path}: {counts}, {wall:.1f} s; refusals {reasons}")
    print("largest movement / sensitivity:")
    for key, value in sorted(worst.items()):
        print(f"  {key}: {value:.3f}")
    assert counts["noised"] >= 15 and counts["refused"] >= 5, counts  # both sides played
