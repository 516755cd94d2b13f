"""A private sketch ranking as a new user runs it (issue 49): a consortium of three sites
of 200 rows and one of 5, four models of which three are close, sites at epsilon 1 and
10. The map from the coordinator, the plan before spending, the sketches, `rank` and the
report page; each defect the user met, as they met it (CLI, parsed output)."""

from __future__ import annotations

import json
import re
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.spatial.distance import pdist
from textkit import cli_error

from distrank.cli import EXIT_INPUT, EXIT_USAGE, main
from distrank.metrics._privacy import noise_multiplier
from distrank.metrics.sketch import _maps as sk

D = 8
SITES = {"oslo": 200, "paris": 200, "rome": 200, "tiny": 5}
MODELS = {"A": (0.0, 1.0), "B": (0.01, 1.0), "C": (0.02, 1.0), "far": (0.6, 1.3)}


@pytest.fixture(scope="module")
def consortium(tmp_path_factory):
    root = tmp_path_factory.mktemp("consortium")
    rng = np.random.default_rng(49)
    for site, n in SITES.items():
        np.savez(root / f"{site}.npz", features=rng.normal(size=(n, D)))
    for name, (mu, sd) in MODELS.items():
        np.savez(root / f"{name}.npz", features=rng.normal(mu, sd, size=(150, D)))
    models = [a for m in MODELS for a in ("--model", f"{m}={root / m}.npz")]
    assert (
        main(
            ["map", *models, "--dim", "2048", "--seed", "1", "--out", str(root / "map.json"), "-q"]
        )
        == 0
    )
    return root, models


def exit_code(args) -> int:
    """The exit status of ``distrank ARGS`` as the shell sees it (argparse exits itself)."""
    try:
        return main(args)
    except SystemExit as done:
        return done.code


def seeded(seed):
    """``numpy.random.default_rng`` that draws from ``seed`` when called without one: the
    sites' noise, made repeatable for the test."""
    fresh = np.random.default_rng
    return mock.patch("numpy.random.default_rng", lambda s=None: fresh(seed if s is None else s))


def sketches(root, tag, epsilon=None):
    out = []
    for i, site in enumerate(SITES):
        path = root / tag / f"{site}.sketch.npz"
        path.parent.mkdir(exist_ok=True)
        args = ["sketch", "--reference", str(root / f"{site}.npz"), "--map", str(root / "map.json")]
        noise = ["--epsilon", str(epsilon), "--delta", "1e-5"] if epsilon else []
        with seeded(100 + i):
            assert main([*args, "--out", str(path), *noise, "-q"]) == 0
        out.append(str(path))
    return out


def test_the_map_is_made_from_the_models_and_recorded_in_each_sketch(consortium):
    root, _ = consortium
    made = json.loads((root / "map.json").read_text())
    pooled = np.concatenate([np.load(root / f"{m}.npz")["features"] for m in MODELS])
    assert made["bandwidth"] == pytest.approx(np.median(pdist(pooled - pooled.mean(0))), rel=1e-12)
    assert (made["dim"], made["seed"], made["input_dim"], made["kernel"]) == (2048, 1, D, "rbf")
    assert made["bandwidth_from"].startswith("median heuristic over the models")
    (path,) = sketches(root, "plain")[:1]
    meta = sk.load(path).meta
    assert meta["bandwidth"] == made["bandwidth"] and len(meta["map_sha256"]) == 64


@pytest.mark.parametrize("epsilon", [1.0, 10.0])
def test_rank_reports_every_pair_the_noise_can_flip(consortium, epsilon, capsys):
    root, models = consortium
    out = root / f"scores-{epsilon:g}.json"
    assert (
        main(
            [
                "rank",
                "--sketch",
                *sketches(root, f"eps{epsilon:g}", epsilon),
                *models,
                "--out",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    data = json.loads(out.read_text())  # --out *.json: JSON, not CSV
    meta, table = data["meta"], pd.DataFrame(data["scores"])
    exact_out = root / "exact.csv"
    assert (
        main(["rank", "--sketch", *sketches(root, "plain"), *models, "--out", str(exact_out), "-q"])
        == 0
    )
    exact = pd.read_csv(exact_out, keep_default_na=False)
    pairs = pd.read_csv(root / f"scores-{epsilon:g}.confidence.csv")
    sites = meta["sketch"]["sites"]
    z = noise_multiplier(epsilon=epsilon, delta=1e-5)
    for site, n in SITES.items():  # each site's privacy, as its sketch says
        assert sites[site]["epsilon"] == epsilon and sites[site]["n"] == n
        assert sites[site]["noise_std"] == pytest.approx(2 * z / n)
    sigma = meta["sketch"]["pooled_noise_std"]
    assert sigma == pytest.approx(2 * z * np.sqrt(len(SITES)) / sum(SITES.values()))
    # every adjacent pair: its gap's noise std 2 sigma |t_a - t_b|, P = Phi(gap / std)
    fmap = sk.FeatureMap(D, 2048, meta["sketch"]["map"]["bandwidth"], 1)
    t = {m: fmap.sketch(np.load(root / f"{m}.npz")["features"]).mean for m in MODELS}
    for p in pairs.itertuples():
        std = 2 * sigma * np.linalg.norm(t[p.model] - t[p.next])
        assert p.noise_std == pytest.approx(std, rel=1e-9)
        assert p.p_order == pytest.approx(stats.norm.cdf(p.gap / std), rel=1e-9)
        assert p.resolved == (p.gap >= stats.norm.ppf(0.95) * std)
    # values unbiased: near the noiseless sketch's, where the raw ones are offset
    ours = table.query("aggregation == 'all'").set_index("model").value
    noiseless = exact.query("aggregation == 'all'").set_index("model").value
    raw = pd.DataFrame(meta["sketch"]["raw"]).query("aggregation == 'all'").set_index("model").value
    offset = meta["sketch"]["bias_removed"]
    assert (raw - ours).to_numpy() == pytest.approx(np.full(4, offset), rel=1e-9)
    assert (ours - noiseless).abs().max() < 0.2 * offset
    # every pair the noise flipped (against the noiseless sketches) is reported unresolved
    on_all = pairs[pairs.aggregation == "all"]
    for p in on_all.itertuples():
        if noiseless[p.model] > noiseless[p.next]:  # the noise put p.model first
            assert not p.resolved and p.p_order < 0.95
    assert on_all[on_all.next.eq("far")].resolved.all()  # the far model stays apart
    if epsilon == 1.0:  # the three close models are not all ranked apart
        assert not on_all.resolved.all()
    printed = capsys.readouterr().out
    unresolved = int(
        re.search(r"all: the whole order holds with probability [\d.]+; (\d+)", printed)[1]
    )
    assert unresolved == (~pairs[pairs.aggregation == "all"].resolved).sum()


def test_the_report_page_shows_the_privacy_and_ties_what_the_noise_does_not_separate(consortium):
    root, models = consortium
    out, page = root / "r.csv", root / "r.html"
    assert (
        main(["rank", "--sketch", *sketches(root, "eps1b", 1.0), *models, "--out", str(out), "-q"])
        == 0
    )
    assert main(["report", str(out), "--out", str(page), "-q"]) == 0
    html = page.read_text()
    facts = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", html))
    assert facts["sketch map"].startswith("rbf, bandwidth ")
    assert "D = 2048, seed 1" in facts["sketch map"]
    for site in SITES:
        assert re.search(
            rf"{site} \(\d+ rows\): epsilon 1, delta 1e-05, noise std", facts["privacy"]
        )
    pairs = pd.read_csv(root / "r.confidence.csv")
    shown = re.findall(r'<tr data-aggregation="all"><td>(.*?)</td><td>(.*?)</td>', html)
    want = pairs[(pairs.aggregation == "all") & ~pairs.resolved]
    assert shown == list(zip(want.model, want.next))
    ranks = dict(
        re.findall(
            r'data-model="(\w+)" data-metric="kd_sketch" data-aggregation="all">[^<]*<span class=rank>\((.*?)\)',
            html,
        )
    )
    for p in want.itertuples():  # an unresolved pair shares its rank
        assert ranks[p.model] == ranks[p.next] and "\u2013" in ranks[p.model]
    verdict = re.search(r'<tr data-metric="kd_sketch">.*?class="(\w+) verdict">(.*?)<', html)
    assert verdict[1] == "warn" and "noise leaves pairs unresolved" in verdict[2]


def test_the_plan_gives_each_pairs_noise_before_any_site_spends(consortium, capsys):
    root, models = consortium
    out = root / "plan.csv"
    args = ["plan", "--map", str(root / "map.json"), *models, "--sizes", "200", "200", "200", "5"]
    assert (
        main(
            [
                *args,
                "--epsilon",
                "1",
                "--delta",
                "1e-5",
                "--target-gap",
                "0.001",
                "--out",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    plan = pd.read_csv(out)
    z = noise_multiplier(epsilon=1.0, delta=1e-5)
    sigma = 2 * z * 2 / 605  # sqrt(4 sites) / n
    made = json.loads((root / "map.json").read_text())
    fmap = sk.FeatureMap(D, 2048, made["bandwidth"], 1)
    t = {m: fmap.sketch(np.load(root / f"{m}.npz")["features"]).mean for m in MODELS}
    assert len(plan) == 6  # every pair of four models
    for row in plan.itertuples():
        std = 2 * sigma * np.linalg.norm(t[row.model] - t[row.other])
        assert row.gap_noise_std == pytest.approx(std, rel=1e-9)
        assert row.smallest_resolved_gap == pytest.approx(stats.norm.ppf(0.95) * std, rel=1e-9)
    assert "noise std per entry is" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args,code,names",
    [
        (
            ["--epsilon", "0", "--delta", "1e-5"],
            EXIT_USAGE,
            "argument --epsilon: expected a number in",
        ),
        (["--epsilon", "1"], EXIT_USAGE, "--epsilon and --delta go together"),
        (["--dim", "7"], EXIT_USAGE, "argument --dim: expected an even positive integer, got '7'"),
        (["--dim", "8"], EXIT_USAGE, "--map fixes the map: drop --dim"),
        (["--extractor", "inception"], EXIT_USAGE, "the map"),
    ],
)
def test_sketch_arguments_are_checked_before_any_input_is_read(
    consortium, tmp_path, capsys, args, code, names
):
    root, _ = consortium
    made = json.loads((root / "map.json").read_text())
    mapped = tmp_path / "map.json"
    mapped.write_text(json.dumps(made | {"extractor": "efficientnet_lite0"}))
    images = tmp_path / "images"  # an image folder: an extraction would fill the cache
    images.mkdir()
    out, cache = tmp_path / "s.sketch.npz", tmp_path / "cache"
    base = ["sketch", "--reference", str(images), "--map", str(mapped), "--out", str(out)]
    assert exit_code([*base, *args, "--cache-dir", str(cache), "-q"]) == code
    assert names in cli_error(capsys.readouterr().err)
    assert not out.exists() and not cache.exists()


def test_rank_names_duplicate_sites_and_an_extractor_the_sketches_do_not_share(
    consortium, tmp_path, capsys
):
    root, models = consortium
    files = sketches(root, "dup")
    other = tmp_path / "oslo.sketch.npz"
    other.write_bytes((root / "dup" / "oslo.sketch.npz").read_bytes())
    out = tmp_path / "s.csv"
    assert (
        main(["rank", "--sketch", files[0], str(other), *models, "--out", str(out), "-q"])
        == EXIT_USAGE
    )
    err = cli_error(capsys.readouterr().err)
    assert files[0] in err and str(other) in err and "both name the site 'oslo'" in err
    made = sk.load(files[0])
    tagged = tmp_path / "tagged.sketch.npz"
    sk.save(
        tagged, sk.Sketch(made.mean, made.n, dict(made.meta) | {"extractor": "efficientnet_lite0"})
    )
    args = ["rank", "--sketch", str(tagged), *models, "--out", str(out), "--extractor", "inception"]
    assert main([*args, "-q"]) == EXIT_USAGE
    assert "the sketches were made with 'efficientnet_lite0'" in cli_error(capsys.readouterr().err)
    missing = ["--model", f"Z={tmp_path / 'nothing.npz'}"]
    assert main(["rank", "--sketch", *files, *missing, "--out", str(out), "-q"]) == EXIT_INPUT
    assert "--model Z: no such file or folder" in cli_error(capsys.readouterr().err)
    assert not out.exists()


def test_rank_writes_the_format_asked(consortium, tmp_path):
    root, models = consortium
    files = sketches(root, "fmt")
    out = tmp_path / "s.csv"
    assert (
        main(["rank", "--sketch", *files, *models, "--out", str(out), "--format", "json", "-q"])
        == 0
    )
    assert set(json.loads(out.read_text())) == {"meta", "scores"}
    md = tmp_path / "s.md"
    assert main(["rank", "--sketch", *files, *models, "--out", str(md), "-q"]) == 0
    rows = re.findall(r"^\| (\w+) +\| +(-?[\d.e+-]+) \|", md.read_text(), flags=re.M)
    assert sorted(model for model, _ in rows) == sorted(MODELS)  # the all/avg markdown table


def test_score_records_the_bandwidth_its_median_heuristic_chose(consortium, tmp_path):
    """So that a sketch map (``distrank map --bandwidth``) can reuse it."""
    root, models = consortium
    x = np.concatenate([np.load(root / f"{s}.npz")["features"] for s in ("oslo", "paris")])
    np.savez(tmp_path / "ref.npz", features=x, clients=np.repeat(["oslo", "paris"], 200))
    out = tmp_path / "s.csv"
    args = ["score", "--reference", str(tmp_path / "ref.npz"), *models[:4], "--out", str(out)]
    assert main([*args, "--metric", "kd", "--kernel", "rbf", "-q"]) == 0
    recorded = json.loads((tmp_path / "s.csv.meta.json").read_text())["bandwidth"]
    assert recorded["value"] == pytest.approx(np.median(pdist(x - x.mean(0))), rel=1e-12)
    assert recorded["from"] == "median heuristic on the pooled reference (seed 0)"
