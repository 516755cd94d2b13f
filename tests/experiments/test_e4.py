"""E4: diversity knob on variance-limited clients (distrank.experiments.e4_diversity_sweep).

Scores come from distrank.metrics.score on synthetic one-cluster clients; the FD curves
are checked against experiments_testkit.fd_scipy (scipy's sqrtm), and the best knobs
against numpy's argmin/argmax of the same curves.
"""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from experiments_testkit import clustered_clients, fd_scipy

from distrank import experiments
from distrank.experiments.e4_diversity_sweep.figures import (
    e4_figure,
    e4_samples_figure,
    e4_terms_figure,
)
from distrank.experiments.e4_diversity_sweep.steps import (
    partition_classes,
    sweep_inputs,
    write_fd,
    write_fitted,
    write_sweep,
)
from distrank.experiments.e4_diversity_sweep.sweep import (
    e4_curves,
    e4_table,
    fd_curves,
    sweep_models,
    theorem2_check,
    theory_table,
)
from distrank.metrics import score
from distrank.metrics.fd._settings import FdSettings, between_classes
from distrank.zoo.feature_space import fitted_samples, pull_to_class_means

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


def labelled(features, models):
    """(name, rows, labels) of the sweep's features: each row's cluster."""
    held = np.repeat(np.arange(6), 80)
    return [(name, x, held) for name, x in features.items()]


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
    FD_all's (tau < 1; more guidance), which sits at the real spread, in every setting;
    its "features" setting is the scorer's FD."""
    x, labels, features, models, scores = sweep
    clients = [x[labels == c] for c in range(6)]
    extrapolation = {"fractions": [0.5, 0.75, 1.0], "draws": 20}
    settings = FdSettings(clients, pca_dims=[6], extrapolation=extrapolation)
    fd = fd_curves(settings.table(labelled(features, models)), models)
    scored = e4_curves(scores, models)
    scored = scored[scored.metric == "FD"].sort_values(["family", "aggregation", "value"])
    ours = fd[fd.setting == "features"].sort_values(["family", "aggregation", "value"])
    np.testing.assert_allclose(ours["fd"], scored["score"], rtol=1e-9)
    # all d principal axes are a rotation, which moves no FD
    rotated = fd[fd.setting == "pca6"].sort_values(["family", "aggregation", "value"])
    np.testing.assert_allclose(rotated["fd"], ours["fd"], rtol=1e-9)
    check = theorem2_check(fd).set_index(["setting", "family"])
    assert list(dict.fromkeys(check.index.get_level_values(0))) == [
        "features",
        "pca6",
        "extrapolated",
    ]
    assert (check["best_all"] == 1.0).all()
    assert (check.xs("simulated", level="family")["best_avg"] < 1.0).all()
    assert (check.xs("guided", level="family")["best_avg"] > 1.0).all()
    assert (check["avg_vs_all"] == "less diverse").all() and (check["seeds_less"] == 1).all()
    assert check["theory_all"].isna().all()  # no fitted family here
    # Pulling to the class means shrinks every cluster: recall falls, precision rises.
    table = e4_table(scored_all := e4_curves(scores, models)).set_index(["family", "metric"])
    assert table.loc[("simulated", "Recall"), "rho_diversity"].min() > 0.9
    assert len(scored_all) == len(models) * 12


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
            rows += [
                ("features", "f", "t", "increasing", v, seed, agg, (v - c) ** 2) for v in values
            ]
    columns = ["setting", "family", "knob", "diversity", "value", "seed", "aggregation", "fd"]
    fd = pd.DataFrame(rows, columns=columns)
    check = theorem2_check(fd).iloc[0]
    assert (check.seeds_less, check.seeds_same, check.seeds_more) == (2, 0, 1)
    assert check.avg_vs_all == "within seed noise"
    # mean avg curve: ((v-1)^2 * 2 + (v-3)^2) / 3 is least at v = 5/3 -> knob 2 of the grid
    assert (check.best_all, check.best_avg) == (2.0, 2.0)
    assert (check.avg_seed_min, check.avg_seed_max, check.all_seed_min) == (1.0, 3.0, 2.0)
    # with the knob's diversity reversed, the same shifts count the other way
    flipped = theorem2_check(fd.assign(diversity="decreasing")).iloc[0]
    assert (flipped.seeds_less, flipped.seeds_more) == (1, 2)
    # a theory curve gives the fitted family's exact best knobs
    theory = pd.DataFrame(
        [
            ("f", "t", "increasing", "features", v, a, (v - c) ** 2)
            for a, c in (("all", 4), ("avg", 1))
            for v in values
        ],
        columns=["family", "knob", "diversity", "setting", "value", "aggregation", "fd"],
    )
    exact = theorem2_check(fd, theory).iloc[0]
    assert (exact.theory_all, exact.theory_avg) == (4.0, 1.0)


def test_figures(sweep):
    x, labels, features, models, _ = sweep
    clients = [x[labels == c] for c in range(6)]
    fd = fd_curves(FdSettings(clients, pca_dims=[3]).table(labelled(features, models)), models)
    theory = theory_table(pd.DataFrame(columns=["setting", "value", "aggregation"]), models)
    fig = e4_figure(fd, theory, "efficientnet_lite0")
    assert [ax.get_title(loc="left") for ax in fig.axes[:2]] == ["simulated", "guided"]
    assert fig.axes[0].get_ylabel() == "FD as scored"
    assert fig.axes[2].get_ylabel() == "FD, PCA to 3 dims"
    assert fig.axes[3].get_xlabel() == "guidance\n(less diverse →)"
    # per panel: two aggregations x (seed mean, best knob), and their bands
    assert all(len(ax.get_lines()) == 4 and len(ax.collections) == 2 for ax in fig.axes)
    mean_all = fd[(fd.setting == "pca3") & (fd.family == "guided") & (fd.aggregation == "all")]
    np.testing.assert_allclose(fig.axes[3].get_lines()[0].get_ydata(), mean_all["fd"])
    terms = e4_terms_figure(fd, "efficientnet_lite0")
    assert len(terms.axes) == 4 and all(len(ax.get_lines()) == 6 for ax in terms.axes)
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
    for figure in (fig, terms, grid):
        plt.close(figure)


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


def test_pre_steps_write_the_fitted_features_and_the_fd_tables(tmp_path):
    rng = np.random.default_rng(6)
    x, labels, _ = clustered_clients(rng, k=3, d=5, sizes=[40, 50, 60])
    client_paths = []
    for c in range(3):
        client_paths.append(tmp_path / f"c{c}.npz")
        np.savez(client_paths[-1], features=x[labels == c].astype(np.float32))
    settings = {
        "partition": "p",
        "seeds": 2,
        "families": {
            "fit": {"kind": "fitted", "knob": "s", "values": [0.5, 1.0]},
            "sim": {"kind": "simulated", "knob": "tau", "values": [1.0]},
        },
        "pca_dims": [2],
    }
    models = sweep_models(settings)
    paths = {name: tmp_path / f"{name}.npz" for name in models}
    fitted = {n: p for n, p in paths.items() if models[n]["family"] == "fit"}
    write_fitted(settings, client_paths, fitted, n_samples=30, seed=1, weights="size")
    np.savez(paths["e4-sim-1-s0"], features=x, labels=labels)
    with np.load(paths["e4-fit-0.5-s1"]) as f:
        np.testing.assert_array_equal(np.bincount(f["labels"]), [8, 10, 12])  # 30 by n_i
        half = f["features"]
    with np.load(paths["e4-fit-1-s1"]) as f:  # the same draw at s = 1 (seed 1 + 1)
        draws = fitted_samples([x[labels == c] for c in range(3)], [0.5], n_samples=30, seed=2)
        np.testing.assert_allclose(half, draws[0.5][0], rtol=1e-6)
        assert not np.allclose(f["features"], half)
    write_fd(
        settings,
        client_paths,
        paths,
        tmp_path / "fd.csv",
        tmp_path / "th.csv",
        weights="size",
        seed=0,
    )
    fd, theory = pd.read_csv(tmp_path / "fd.csv"), pd.read_csv(tmp_path / "th.csv")
    assert len(fd) == len(models) * 2 * 2  # settings features and pca2, all and avg
    assert sorted(set(theory["value"])) == [0.5, 1.0] and len(theory) == 2 * 2 * 2
    real = fd[(fd.model == "e4-sim-1-s0") & (fd.setting == "features") & (fd.aggregation == "all")]
    assert real["fd"].iloc[0] == pytest.approx(0.0, abs=1e-9)  # the pool itself
    assert real["trace_between"].iloc[0] == pytest.approx(between_classes(x, labels), rel=1e-12)
