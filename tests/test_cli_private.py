"""`distrank score --private EPSILON --delta DELTA` and `--intervals N`: the table equals
the library's (private_scores, bootstrap_scores) on the same inputs and seed; the budget
and the interval method are recorded in the metadata; misuse is an input error."""

import contextlib
import io
import json

import numpy as np
import pandas as pd
import pytest
from textkit import cli_error

from distrank.cli import EXIT_INPUT, main
from distrank.metrics._bootstrap import bootstrap_scores, flat_summary, score_intervals
from distrank.metrics.kd._privacy import private_scores

RNG = np.random.default_rng(13)
D = 3
MODELS = ("good", "bad", "odd")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture
def files(tmp_path):
    clients = np.repeat(["north", "south", "east"], [25, 30, 35])
    x = RNG.normal(size=(90, D)) + (clients == "south")[:, None] * 2.0
    models = {
        "good": RNG.normal(0.5, 1.2, size=(40, D)),
        "bad": RNG.normal(3.0, 0.3, size=(30, D)),
        "odd": RNG.normal(-1.0, 2.0, size=(35, D)),
    }
    np.savez(tmp_path / "ref.npz", features=x, clients=clients)
    for name, y in models.items():
        np.savez(tmp_path / f"{name}.npz", features=y)
    return tmp_path


def inputs(path):
    with np.load(path / "ref.npz") as ref:
        x, clients = ref["features"], ref["clients"]
    return x, clients, {n: np.load(path / f"{n}.npz")["features"] for n in MODELS}


def score_args(path, *extra):
    models = [a for n in MODELS for a in ("--model", f"{n}={path / (n + '.npz')}")]
    return ["score", "--reference", str(path / "ref.npz"), *models, "--dtype", "float64", *extra]


def test_private_scores_equal_the_library_and_record_the_budget(files, capsys):
    out = files / "private.csv"
    status = main(
        score_args(
            files,
            "--metric",
            "kd",
            "--kernel",
            "rbf",
            "--kernel-param",
            "bandwidth=1.5",
            "--private",
            "1.0",
            "--delta",
            "1e-5",
            "--seed",
            "4",
            "--out",
            str(out),
        )
    )
    assert status == 0
    table = pd.read_csv(out, keep_default_na=False)
    x, clients, models = inputs(files)
    expected, budget = private_scores(
        x,
        clients,
        models,
        epsilon=1.0,
        delta=1e-5,
        kernel_params={"bandwidth": 1.5},
        seed=4,
        dtype="float64",
    )
    pd.testing.assert_frame_equal(table, expected, check_exact=False, rtol=1e-12)
    assert set(table.aggregation) == {"avg", "client"}
    meta = json.loads((files / "private.csv.meta.json").read_text())
    privacy = meta["privacy"]
    assert privacy["epsilon"] == 1.0 and privacy["delta"] == 1e-5
    assert privacy["n_releases"] == 3
    assert privacy["epsilon_spent"] == pytest.approx(budget.epsilon_spent, rel=1e-12)
    assert privacy["noise_multiplier"] == pytest.approx(budget.noise_multiplier, rel=1e-12)
    assert "epsilon" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            (
                "--metric",
                "kd",
                "--kernel",
                "rbf",
                "--kernel-param",
                "bandwidth=1",
                "--private",
                "1",
            ),
            "--delta",
        ),
        (
            (
                "--kernel",
                "rbf",
                "--kernel-param",
                "bandwidth=1",
                "--private",
                "1",
                "--delta",
                "1e-5",
            ),
            "--metric kd",
        ),
        (("--metric", "kd", "--private", "1", "--delta", "1e-5"), "kernel"),
        (("--metric", "kd", "--kernel", "rbf", "--private", "1", "--delta", "1e-5"), "bandwidth"),
        (
            (
                "--metric",
                "kd",
                "--kernel",
                "rbf",
                "--kernel-param",
                "bandwidth=1",
                "--private",
                "0",
                "--delta",
                "1e-5",
            ),
            "epsilon",
        ),
        (
            (
                "--metric",
                "kd",
                "--kernel",
                "rbf",
                "--kernel-param",
                "bandwidth=1",
                "--private",
                "1",
                "--delta",
                "1e-5",
                "--intervals",
                "10",
            ),
            "--intervals",
        ),
        (
            (
                "--metric",
                "kd",
                "--kd-estimator",
                "subsets",
                "--subset-size",
                "10",
                "--n-subsets",
                "2",
                "--intervals",
                "10",
            ),
            "kd_estimator",
        ),
    ],
)
def test_misuse_is_an_input_error_and_writes_nothing(files, capsys, extra, message):
    out = files / "bad.csv"
    assert main(score_args(files, *extra, "--out", str(out))) == EXIT_INPUT
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_intervals_add_low_and_high_from_the_bootstrap(files):
    out = files / "intervals.csv"
    status = main(
        score_args(
            files, "--metric", "kd", "fd", "--intervals", "40", "--seed", "2", "--out", str(out)
        )
    )
    assert status == 0
    table = pd.read_csv(out, keep_default_na=False)
    assert list(table.columns) == [
        "model",
        "metric",
        "aggregation",
        "client",
        "value",
        "low",
        "high",
    ]
    x, clients, models = inputs(files)
    result = bootstrap_scores(
        x,
        clients,
        models,
        summary=flat_summary,
        metrics=("kd", "fd"),
        n_resamples=40,
        seed=2,
        dtype="float64",
    )
    expected = score_intervals(result)
    keys = ["model", "metric", "aggregation", "client"]
    merged = table.merge(expected, on=keys, suffixes=("", "_lib"))
    assert len(merged) == len(table) == len(expected)
    for column in ("value", "low", "high"):
        np.testing.assert_allclose(merged[column], merged[f"{column}_lib"], rtol=1e-12)
    assert (table.low <= table.high).all()
    meta = json.loads((files / "intervals.csv.meta.json").read_text())
    assert meta["intervals"]["n_resamples"] == 40
    assert meta["intervals"]["confidence_level"] == 0.95
    assert "percentile" in meta["intervals"]["method"]


@pytest.mark.parametrize("epsilon", ["0", "-1", "9e-4", "2e9", "nan", "inf"])
def test_private_epsilon_outside_its_range_is_an_input_error(files, capsys, epsilon):
    out = files / "bad.csv"
    private = ("--metric", "kd", "--kernel", "rbf", "--kernel-param", "bandwidth=1")
    args = score_args(files, *private, "--private", epsilon, "--delta", "1e-5", "--out", str(out))
    assert main(args) == EXIT_INPUT
    message = cli_error(capsys.readouterr().err, "score")
    assert message.startswith("--private: expected an epsilon in [0.001, 1e+09], got ")
    assert not out.exists()


@pytest.fixture(scope="module")
def private_run(tmp_path_factory):
    """`score --private 10 --level 0.9` as a user runs it: three clients of 250-350 rows
    and four models, two of them close, so that the noise separates some adjacent pairs
    and not others; (folder, table path, printed lines)."""
    root = tmp_path_factory.mktemp("private-confidence")
    rng = np.random.default_rng(49)
    clients = np.repeat(["north", "south", "east"], [250, 300, 350])
    x = rng.normal(size=(900, D)) + (clients == "south")[:, None] * 0.3
    np.savez(root / "ref.npz", features=x, clients=clients)
    models = []
    for name, mu in (("good", 0.1), ("near", 0.12), ("bad", 1.0), ("worse", 2.0)):
        np.savez(root / f"{name}.npz", features=rng.normal(mu, 1.0, size=(400, D)))
        models += ["--model", f"{name}={root / name}.npz"]
    private = ["--metric", "kd", "--kernel", "rbf", "--kernel-param", "bandwidth=1.5"]
    private += ["--private", "10", "--delta", "1e-5", "--level", "0.9", "--seed", "3"]
    out = root / "p.csv"
    args = ["score", "--reference", str(root / "ref.npz"), *models, *private, "--out", str(out)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main([*args, "--dtype", "float64"]) == 0
    return root, out, printed.getvalue().splitlines()


def avg_noise(meta) -> float:
    """s = sqrt(sum_i w_i^2 sigma_i^2) = 4 z sqrt(k) / n under the weights n_i / n, z the
    noise multiplier of 4 releases at (10, 1e-5) from dp-accounting called here."""
    import dp_accounting

    z = 2.0 * dp_accounting.get_sigma_gaussian(10.0, 1e-5)  # sqrt(4 releases) z_1
    for client, n in {"north": 250, "south": 300, "east": 350}.items():
        assert meta["privacy"]["client_noise_std"][client] == pytest.approx(4 * z / n, rel=1e-6)
    return 4 * z * np.sqrt(3) / 900


def test_private_scores_give_the_confidence_their_noise_leaves(private_run):
    """Beside the table, per adjacent pair of the avg ranking: the gap, its noise std
    sqrt(2) s, P(order) and resolved at --level; the metadata and the printout agree."""
    from scipy.stats import norm
    from textkit import words

    root, out, printed = private_run
    table = pd.read_csv(out, keep_default_na=False)
    avg = table[table.aggregation == "avg"].set_index("model").value.sort_values()
    meta = json.loads((root / "p.csv.meta.json").read_text())
    s = avg_noise(meta)
    assert meta["privacy"]["avg_noise_std"] == pytest.approx(s, rel=1e-6)
    pairs = pd.read_csv(root / "p.confidence.csv")
    assert list(pairs.model) == list(avg.index[:-1]) and list(pairs.next) == list(avg.index[1:])
    np.testing.assert_allclose(pairs.gap, np.diff(avg.to_numpy()), rtol=1e-12)
    np.testing.assert_allclose(pairs.noise_std, np.sqrt(2) * s, rtol=1e-6)
    np.testing.assert_allclose(pairs.p_order, norm.cdf(pairs.gap / pairs.noise_std), rtol=1e-6)
    assert list(pairs.resolved) == list(pairs.gap >= norm.ppf(0.9) * pairs.noise_std)
    assert set(pairs.aggregation) == {"avg"} and set(pairs.level) == {0.9}
    assert pairs.resolved.any() and not pairs.resolved.all()
    recorded = pd.DataFrame(meta["confidence"]["pairs"])[list(pairs.columns)]
    pd.testing.assert_frame_equal(recorded, pairs, check_exact=False, rtol=1e-12)
    (line,) = [t for t in printed if t.startswith("avg: the whole order holds")]
    whole = meta["confidence"]["order"]["avg"]
    assert words(line)[7:9] == [f"{whole:.3f}", str((~pairs.resolved).sum())]


def test_the_private_report_shows_the_privacy_and_ties_what_the_noise_does_not_separate(
    private_run,
):
    """The page of a --private table: the privacy parameters and the avg's noise, the avg
    ranking with models joined by an unresolved pair sharing a rank, every unresolved
    pair, and no word "safe"."""
    from textkit import html_tables, visible_lines, words

    root, out, _ = private_run
    page = root / "p.html"
    assert main(["report", str(out), "--out", str(page), "-q"]) == 0
    html = page.read_text()
    lines = visible_lines(html)
    facts = {lines[i]: lines[i + 1] for i in range(len(lines) - 1)}
    assert facts["privacy"].startswith("each client epsilon 10, delta 1e-05 over 4 releases")
    s = avg_noise(json.loads((root / "p.csv.meta.json").read_text()))
    assert facts["noise std of each avg"] == f"{s:.3g}"
    pairs = pd.read_csv(root / "p.confidence.csv")
    tables = {tuple(t[0]): t[1:] for t in html_tables(html)}
    values = tables[("model", "KD avg \u2193", "rank")]
    assert [r[0] for r in values] == [pairs.model[0], *pairs.next]
    ranks = {r[0]: r[2] for r in values}
    for p in pairs.itertuples():  # an unresolved pair shares its rank, a resolved one not
        assert (ranks[p.model] == ranks[p.next]) == (not p.resolved)
    shown = tables[("model", "next", "gap", "noise std of the gap", "P(order)")]
    open_ = pairs[~pairs.resolved]
    assert [tuple(r[:2]) for r in shown] == list(zip(open_.model, open_.next))
    assert not any("safe" in words(t.lower()) for t in lines)


def test_level_without_private_is_a_usage_error(files, capsys):
    out = files / "level.csv"
    assert main(score_args(files, "--metric", "kd", "--level", "0.9", "--out", str(out))) == 2
    assert cli_error(capsys.readouterr().err, "score").startswith("--level: ")
    assert not out.exists()
