"""E4: diversity knob on variance-limited clients (distrank.experiments.e4_diversity_sweep).

Scores come from distrank.metrics.score on synthetic one-cluster clients; the FD curves
are checked against experiments_testkit.fd_scipy (scipy's sqrtm), and the best knobs
against numpy's argmin/argmax of the same curves.
"""

import numpy as np
import pandas as pd
import pytest
from experiments_testkit import clustered_clients, fd_scipy

from distrank import experiments
from distrank.experiments.e4_diversity_sweep import (
    e4_curves,
    e4_figure,
    e4_samples_figure,
    e4_table,
    mean_curves,
    partition_classes,
    pull_to_class_means,
    sweep_inputs,
    sweep_models,
    theorem2_check,
    write_sweep,
)
from distrank.metrics import score

SETTINGS = {
    "partition": "one_class",
    "families": {
        "simulated": {
            "kind": "simulated",
            "knob": "tau",
            "values": [0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6],
        },
        "guided": {
            "kind": "diffusion",
            "knob": "guidance",
            "values": [0.5, 0.75, 1, 1.5, 2, 4],
            "diversity": "decreasing",
        },
    },
}


@pytest.fixture(scope="module")
def sweep():
    """Six variance-limited clients; the simulated family pulls held-out rows of the same
    clusters to their means, the 'guided' stand-in draws each cluster with spread
    0.4 / guidance (the clients' own at guidance 1), from the same noise at every value."""
    rng = np.random.default_rng(3)
    x, labels, means = clustered_clients(rng, k=6, d=6)
    held_labels = np.repeat(np.arange(6), 80)
    held = means[held_labels] + 0.4 * rng.standard_normal((len(held_labels), 6))
    models = sweep_models(SETTINGS)
    noise = rng.standard_normal(held.shape)
    features = {}
    for name, m in models.items():
        if m["family"] == "simulated":
            features[name] = pull_to_class_means(held, held_labels, m["value"])
        else:
            features[name] = means[held_labels] + 0.4 / m["value"] * noise
    scores = score(x, labels, features, dtype="float64")
    return x, labels, features, models, scores


def test_sweep_models_and_what_e4_scores():
    models = sweep_models(SETTINGS)
    assert list(models)[:2] == ["e4-simulated-0.2", "e4-simulated-0.4"]
    assert models["e4-guided-2"] == {
        "family": "guided",
        "knob": "guidance",
        "value": 2.0,
        "seed": 0,
        "decreasing": True,
        "spec": {"kind": "diffusion", "guidance": 2},
    }
    assert models["e4-simulated-1"]["spec"] == {"kind": "simulated"}
    partition, names = experiments.get("E4").scores(SETTINGS, {})
    assert partition == "one_class" and names == list(models)
    assert partition_classes({"kind": "one_class", "classes": [2, 0]}) == [2, 0]
    assert partition_classes({"kind": "by_class", "groups": [[3, 1], [0]]}) == [0, 1, 3]
    assert partition_classes({"kind": "dirichlet", "n_clients": 3, "alpha": 1}) is None


def test_pull_to_class_means_is_the_affine_map_of_each_class():
    rng = np.random.default_rng(0)
    x, labels = rng.standard_normal((50, 4)), rng.integers(0, 3, 50)
    pulled = pull_to_class_means(x, labels, 0.3)
    for c in range(3):
        mean = x[labels == c].mean(axis=0)
        np.testing.assert_allclose(pulled[labels == c].mean(axis=0), mean, atol=1e-14)
        np.testing.assert_allclose(
            pulled[labels == c] - mean, 0.3 * (x[labels == c] - mean), atol=1e-14
        )
    np.testing.assert_allclose(pull_to_class_means(x, labels, 1.0), x, atol=1e-14)
    with pytest.raises(ValueError, match=r"^tau: expected >= 0"):
        pull_to_class_means(x, labels, -1.0)


def test_curves_hold_the_scores(sweep):
    x, labels, features, models, scores = sweep
    curves = e4_curves(scores, models)
    assert len(curves) == len(models) * 6 * 2
    row = curves[(curves.family == "simulated") & (curves.value == 0.6) & (curves.metric == "FD")]
    name = "e4-simulated-0.6"
    fd_all = fd_scipy(x, features[name])
    lam = np.bincount(labels) / len(labels)
    fd_avg = sum(w * fd_scipy(x[labels == c], features[name]) for c, w in enumerate(lam))
    assert row.set_index("aggregation")["score"].to_dict() == pytest.approx(
        {"all": fd_all, "avg": fd_avg}, rel=1e-7
    )
    with pytest.raises(ValueError, match="sweep models"):
        e4_curves(scores[scores.model != name], models)


def test_best_knob_is_the_argmin_or_argmax_of_each_curve(sweep):
    *_, models, scores = sweep
    curves = e4_curves(scores, models)
    table = e4_table(curves)
    assert len(table) == 2 * 6 * 2
    for _, row in table.iterrows():
        curve = curves[
            (curves.family == row.family)
            & (curves.metric == row.metric)
            & (curves.aggregation == row.aggregation)
        ].sort_values("value")
        pick = (
            np.argmax if row.metric in ("Precision", "Recall", "Density", "Coverage") else np.argmin
        )
        i = pick(curve["score"].to_numpy())
        assert (row.best_value, row.best_score) == (curve["value"].iloc[i], curve["score"].iloc[i])


def test_kd_all_and_avg_pick_the_same_knob_in_every_family(sweep):
    """Theorem 1: the KD gap is one number for every model, so the argmin is shared."""
    *_, models, scores = sweep
    kd = scores[(scores.metric == "kd") & (scores.aggregation != "client")]
    wide = kd.pivot(index="model", columns="aggregation", values="value")
    gap = wide["avg"] - wide["all"]
    assert gap.max() - gap.min() <= 1e-9 * gap.abs().max()
    table = e4_table(e4_curves(scores, models))
    best = table[table.metric == "KD"].pivot(
        index="family", columns="aggregation", values="best_value"
    )
    assert (best["all"] == best["avg"]).all()


def test_fd_avg_prefers_less_diversity_on_variance_limited_clients(sweep):
    """Theorem 2 on one-cluster clients: FD_avg's argmin lies at lower diversity than
    FD_all's (tau < 1; more guidance), which sits at the real spread."""
    *_, models, scores = sweep
    check = theorem2_check(e4_curves(scores, models), models).set_index("family")
    assert check.loc["simulated", "best_all"] == check.loc["guided", "best_all"] == 1.0
    assert check.loc["simulated", "best_avg"] < 1.0
    assert check.loc["guided", "best_avg"] > 1.0
    assert (check["avg_vs_all"] == "less diverse").all()
    assert list(check["seeds_less"]) == [1, 1]
    assert list(check["diversity"]) == ["increasing", "decreasing"]
    # Pulling to the class means shrinks every cluster: recall falls, precision rises.
    assert check.loc["simulated", "rho_recall"] > 0.9


def test_seeds_name_the_models_and_the_table_counts_each_seeds_argmin():
    models = sweep_models({**SETTINGS, "seeds": 3})
    assert [n for n in models if n.startswith("e4-guided-2")] == [
        "e4-guided-2-s0",
        "e4-guided-2-s1",
        "e4-guided-2-s2",
    ]
    assert [models[n]["seed"] for n in models if n.startswith("e4-guided-2")] == [0, 1, 2]
    assert [n for n in models if n.startswith("e4-simulated-1-")] == ["e4-simulated-1-s0"]
    # FD curves (x - c)^2 with their argmin c per seed and aggregation: all's at knob 2,
    # avg's at 1 in seeds 0 and 1 (less diverse) and at 3 in seed 2 (more diverse).
    values, rows = [1.0, 2.0, 3.0, 4.0], []
    for seed, c_avg in enumerate([1.0, 1.0, 3.0]):
        for agg, c in (("all", 2.0), ("avg", c_avg)):
            for v in values:
                rows.append(("f", "t", v, seed, "FD", agg, (v - c) ** 2))
                rows.append(("f", "t", v, seed, "Recall", agg, v / 10))
                rows.append(("f", "t", v, seed, "Precision", agg, 1 - v**2 / 20))
    curves = pd.DataFrame(
        rows, columns=["family", "knob", "value", "seed", "metric", "aggregation", "score"]
    )
    models = {f"m{v}-{s}": {"family": "f", "decreasing": False} for v in values for s in range(3)}
    check = theorem2_check(curves, models).iloc[0]
    assert (check.seeds_less, check.seeds_same, check.seeds_more) == (2, 0, 1)
    assert check.avg_vs_all == "within seed noise"
    # mean avg curve: ((v-1)^2 * 2 + (v-3)^2) / 3 is least at v = 5/3 -> knob 2 of the grid
    assert (check.best_all, check.best_avg) == (2.0, 2.0)
    assert (check.rho_recall, check.rho_precision) == (1.0, -1.0)
    table = e4_table(curves).set_index(["metric", "aggregation"])
    assert table.loc[("FD", "avg"), ["seed_best_min", "seed_best_max"]].tolist() == [1.0, 3.0]
    assert table.loc[("Recall", "all"), "interior"] == False  # noqa: E712 (numpy bool)


def test_figures(sweep):
    *_, models, scores = sweep
    curves = e4_curves(scores, models)
    fig = e4_figure(mean_curves(curves), e4_table(curves), "efficientnet_lite0")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 6
    assert panels[0].get_ylabel().startswith("KD") and panels[0].get_xlabel() == "knob value"
    # per panel: two families x (all, avg) curves and their best-value markers
    assert all(len(ax.get_lines()) == 8 for ax in panels)
    images = {
        name: np.full((12, 28, 28), i * 10, np.uint8)
        for i, name in enumerate(n for n in models if n.startswith("e4-guided"))
    }
    grid = e4_samples_figure(images, models)
    assert len(grid.axes) == 1 and grid.axes[0].get_ylabel() == "guidance"
    assert [t.get_text() for t in grid.axes[0].get_yticklabels()] == [
        "0.5",
        "0.75",
        "1",
        "1.5",
        "2",
        "4",
    ]


def test_write_sweep_makes_the_simulated_features(tmp_path):
    rng = np.random.default_rng(1)
    feats, labels = rng.standard_normal((40, 3)).astype(np.float32), np.arange(40) % 4
    np.savez(tmp_path / "heldout.npz", features=feats, labels=labels)
    settings = {
        "partition": "one_class",
        "families": {"sim": {"kind": "simulated", "knob": "tau", "values": [0.5, 1.5]}},
    }
    outputs = {name: {"features": tmp_path / f"{name}.npz"} for name in sweep_models(settings)}
    write_sweep(
        settings,
        {"heldout_features": tmp_path / "heldout.npz"},
        outputs,
        n_samples=10,
        seed=0,
        classes=[1, 3],
        features={},
        batch_size=8,
    )
    with np.load(outputs["e4-sim-0.5"]["features"]) as f:
        keep = np.isin(labels, [1, 3])
        np.testing.assert_array_equal(f["labels"], labels[keep])
        np.testing.assert_allclose(
            f["features"], pull_to_class_means(feats[keep], labels[keep], 0.5)
        )


def test_check_names_the_bad_key():
    exp = experiments.get("E4")
    config = {"zoo": {"cgan": {}}, "heldout": {}}
    bad = {
        "partition": "p",
        "families": {"g": {"kind": "vae", "knob": "temperature", "values": [1, 2]}},
    }
    with pytest.raises(ValueError, match=r"experiments\.E4\.families\.g\.kind"):
        exp.check(bad, config)
    bad["families"]["g"] = {"kind": "cgan", "knob": "truncation", "values": [1, 1]}
    with pytest.raises(ValueError, match=r"experiments\.E4\.families\.g\.values"):
        exp.check(bad, config)
    bad["families"]["g"] = {"kind": "simulated", "knob": "tau", "values": [1]}
    with pytest.raises(ValueError, match="no heldout"):
        exp.check(bad, {"zoo": {}})


def test_sweep_inputs_name_what_each_family_is_made_from():
    settings = {
        "families": {
            "g": {"kind": "cgan", "knob": "truncation", "values": [1, 2]},
            "s": {
                "kind": "checkpoint",
                "checkpoint": "net",
                "code": "src",
                "knob": "truncation_psi",
                "values": [0.5, 1],
            },
            "t": {"kind": "simulated", "knob": "tau", "values": [0.5, 1]},
            "n": {"kind": "noise", "knob": "sigma", "values": [8, 16], "diversity": "decreasing"},
        }
    }

    def model_files(spec):  # the workflow's (common.smk), for these kinds
        if spec["kind"] == "cgan":
            return {"state": "results/x/zoo/cgan.pt"}
        if spec["kind"] == "checkpoint":
            return {
                "checkpoint": f"downloads/{spec['checkpoint']}",
                "code": f"downloads/{spec['code']}",
            }
        return {"heldout": "results/x/images/heldout.npz"}

    got = sweep_inputs(settings, model_files, "results/x/features/heldout.npz")
    assert got == {
        "state_g": "results/x/zoo/cgan.pt",
        "checkpoint_s": "downloads/net",
        "code_s": "downloads/src",
        "heldout_features": "results/x/features/heldout.npz",
        "heldout": "results/x/images/heldout.npz",
    }
