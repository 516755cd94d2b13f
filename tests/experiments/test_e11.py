"""E11: private kernel mean sketches. Sketch KD against a dense numpy U statistic (its
mean over maps is exactly that statistic), the flip probability against its closed form
and against simulated releases, noise stds and FD from moments against dp-accounting and
scipy, and the pre-steps' files through to the outputs."""

import math

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from experiments_testkit import clustered_clients, fd_scipy
from scipy import linalg, stats

from distrank.clients import save_manifest
from distrank.experiments import Job, Outputs, run_rule
from distrank.experiments.e9_private_ranking import e9_table
from distrank.experiments.e11_private_sketches import (
    LEVELS,
    bytes_per_site,
    calibration,
    check,
    clip_rows,
    e11_table,
    fd_from_moments,
    flip_probability,
    moment_sensitivity,
    run,
    sketch_scores,
    threshold,
)
from distrank.metrics.fd._frechet import gaussian_stats
from distrank.metrics.sketch._maps import FeatureMap, pool, sketch_kd, truncate

RNG = np.random.default_rng(11)


def kd_ustat(x, y, bandwidth):
    """Unbiased squared MMD with the Gaussian kernel exp(-|x - y|^2 / (2 h^2)), dense."""

    def k(a, b):
        return np.exp(-((a[:, None] - b[None]) ** 2).sum(-1) / (2 * bandwidth**2))

    kxx, kyy, n, m = k(x, x), k(y, y), len(x), len(y)
    return (kxx.sum() - n) / (n * (n - 1)) + (kyy.sum() - m) / (m * (m - 1)) - 2 * k(x, y).mean()


def test_truncate_is_the_smaller_map_of_the_same_seed():
    x = RNG.normal(size=(30, 5))
    full = FeatureMap(5, 256, 1.7, seed=3).sketch(x)
    small = FeatureMap(5, 64, 1.7, seed=3).sketch(x)
    cut = truncate(full, 64)
    np.testing.assert_allclose(cut.mean, small.mean, rtol=1e-12, atol=1e-15)
    assert cut.meta == small.meta and cut.n == 30
    with pytest.raises(ValueError, match=r"^dim: expected an even number up to"):
        truncate(full, 512)


def test_sketch_kd_tends_to_the_exact_kd_as_d_grows():
    """Over maps, E[phi(x).phi(y)] = k(x, y) and |phi| = 1, so sketch KD is an unbiased
    estimate of the exact U statistic with std ~ D^-1/2: the mean over 400 maps of D = 16
    is within 4 standard errors of the exact value, and the mean error over 8 maps falls
    about 4-fold per 16-fold D, below twice the std that D = 16's predicts at D = 16384."""
    x, y, h = RNG.normal(size=(40, 3)), RNG.normal(0.5, 1.2, size=(30, 3)), 1.5
    exact = kd_ustat(x, y, h)

    def sketched(dim, seed):
        fmap = FeatureMap(3, dim, h, seed=seed)
        return sketch_kd(fmap.sketch(x), fmap.sketch(y))

    values = np.array([sketched(16, s) for s in range(400)])
    assert abs(values.mean() - exact) < 4 * values.std(ddof=1) / math.sqrt(400)
    errors = [np.mean([abs(sketched(d, s) - exact) for s in range(8)]) for d in (64, 1024, 16384)]
    assert errors[0] > 2.5 * errors[1] > 6 * errors[2]
    assert errors[2] < 2 * values.std(ddof=1) * math.sqrt(16 / 16384) < 0.05 * exact


def test_sketch_scores_are_sketch_kd():
    fmap = FeatureMap(4, 128, 2.0, seed=1)
    clients = [fmap.sketch(RNG.normal(size=(n, 4))) for n in (20, 35)]
    models = [fmap.sketch(RNG.normal(0.3 * g, 1.0, size=(25 + g, 4))) for g in range(3)]
    pooled = pool(clients)
    got = sketch_scores(
        np.stack([pooled.mean] * 2), pooled.n, [t.mean for t in models], [t.n for t in models]
    )
    expected = [sketch_kd(pooled, t) for t in models]
    np.testing.assert_allclose(got, [expected, expected], rtol=1e-12)


def sketch_inputs(rng, *, sizes=(60, 60, 60), n_models=5, dim=256, d=3):
    """What the sketch pre-step writes, for synthetic clients and models."""
    x, owner, _ = clustered_clients(rng, k=len(sizes), d=d, sizes=list(sizes), spread=1.0)
    models = [rng.normal(0.15 * g, 1.0, size=(50, d)) for g in range(n_models)]
    h, fmap = 2.0, FeatureMap(d, dim, 2.0, seed=0)
    kd_client = np.array(
        [[kd_ustat(x[owner == c], y, h) for c in range(len(sizes))] for y in models]
    )
    return {
        "models": np.array([f"m{g}" for g in range(n_models)]),
        "bandwidth": h,
        "seed": 0,
        "input_dim": d,
        "model_sizes": np.array([50] * n_models),
        "client_sketches": np.array([fmap.sketch(x[owner == c]).mean for c in range(len(sizes))]),
        "model_sketches": np.array([fmap.sketch(y).mean for y in models]),
        "kd_client": kd_client,
        "kd_all": np.array([kd_ustat(x, y, h) for y in models]),
        "client_sizes": np.array(sizes),
    }


SETTINGS = {
    "dims": [64, 256],
    "epsilons": [0.3, 1.0],
    "delta": 1e-5,
    "n_draws": 3000,
    "fd": {"clip_norm": 5.0, "epsilons": [10.0], "n_draws": 2},
}
CONTEXT = {"seed": 4, "metrics": {"kd_estimator": "unbiased", "weights": "size"}}


def fd_arrays(n_models):
    fd_all = np.arange(1.0, n_models + 1)
    draws = np.stack([fd_all[::-1], fd_all])[None]  # one reversed draw, one exact
    return {"fd_all": fd_all, "fd_clipped": fd_all * 1.01, "noise_std": [7.0], "fd_noisy": draws}


@pytest.fixture(scope="module")
def e11():
    inputs = sketch_inputs(np.random.default_rng(5))
    table, flips, calibrated = e11_table(inputs, fd_arrays(5), SETTINGS, CONTEXT)
    return inputs, table, flips, calibrated


def test_flip_rates_and_noise_have_their_closed_forms(e11):
    """Each adjacent pair swaps with probability Phi(-g / (2 sigma |v|)), measured within
    4 binomial standard errors; sigma from dp-accounting's calibration: local, sqrt(sum_i
    (n_i z 2/n_i)^2) / n; secure, 2 z sqrt(k / t) / n, t a majority."""
    inputs, table, flips, _ = e11
    n, k = inputs["client_sizes"].sum(), len(inputs["client_sizes"])
    for row in flips.itertuples():
        z = dp_accounting.get_sigma_gaussian(row.epsilon, 1e-5)
        local = math.sqrt(k * (2 * z) ** 2) / n
        expected_std = local if row.protocol == "sketch" else 2 * z * math.sqrt(k / 2) / n
        assert row.noise_std == pytest.approx(expected_std, rel=1e-9)
        p = 0.5 * math.erfc(row.sketch_gap / (2 * row.noise_std * row.diff_norm) / math.sqrt(2))
        assert row.p_flip_predicted == pytest.approx(p, rel=1e-9, abs=1e-300)
        se = math.sqrt(max(p * (1 - p), 1e-4) / row.n_draws)
        assert abs(row.p_flip_measured - p) < 4 * se + 1e-3
    assert threshold(3) == 2 and threshold(4) == 3
    secure = flips[flips.protocol == "secure_sketch"].noise_std.to_numpy()
    assert (secure < flips[flips.protocol == "sketch"].noise_std.to_numpy()).all()
    assert flip_probability(0.0, 1.0, 1.0) == 0.5


def test_calibration_of_gaussian_gaps_has_its_closed_forms():
    """On 20000 synthetic N(g, s^2) gaps: coverage within 4 binomial standard errors of the
    nominal level, z from scipy's normal quantile, P(resolved) = Phi(g/s - z) + Phi(-g/s - z)
    and P(resolved the wrong way) = Phi(-|g|/s - z), each within 4 standard errors; a
    direct recount agrees exactly."""
    rng, n = np.random.default_rng(49), 20_000
    gap, std = np.array([0.0, 0.3, -1.0, 2.5]), np.array([1.0, 0.2, 0.7, 0.5])
    draws = gap + std * rng.standard_normal((n, 4))
    got = calibration(draws, gap, std)
    assert got["coverage"].shape == (len(LEVELS), 4)
    for i, c in enumerate(LEVELS):
        z = stats.norm.ppf(0.5 + c / 2)
        assert got["z"][i, 0] == pytest.approx(z, rel=1e-12)
        se = math.sqrt(c * (1 - c) / n)
        np.testing.assert_allclose(got["coverage_se"][i], se, rtol=1e-12)
        np.testing.assert_array_less(np.abs(got["coverage"][i] - c), 4 * se)
        recount = (np.abs(draws - gap) <= z * std).mean(0)
        np.testing.assert_array_equal(got["coverage"][i], recount)
        np.testing.assert_allclose(got["coverage_z"][i], (recount - c) / se, rtol=1e-12)
        r = gap / std
        resolved = stats.norm.cdf(r - z) + stats.norm.cdf(-r - z)
        wrong = np.where(gap == 0, resolved, stats.norm.cdf(-np.abs(r) - z))
        for measured, p in ((got["p_resolved"][i], resolved), (got["p_resolved_wrong"][i], wrong)):
            np.testing.assert_array_less(np.abs(measured - p), 4 * np.sqrt(p * (1 - p) / n) + 1e-9)
        assert np.all(got["p_resolved_wrong"][i, 1:] <= (1 - c) / 2 + 4 * se)
    with pytest.raises(ValueError, match=r"^levels: expected numbers strictly between 0 and 1"):
        calibration(draws, gap, std, levels=[0.5, 1.0])
    with pytest.raises(ValueError, match=r"^gap_std: expected positive numbers"):
        calibration(draws, gap, [1.0, 0.0, 1.0, 1.0])


def test_calibration_table_of_the_sketch_draws(e11):
    """Each adjacent pair's noisy-gap interval covers the noiseless sketch gap at its nominal
    level within 4 binomial standard errors (3000 draws); its noise std is 2 sigma |v|
    of the flips table; the rows are pairs x levels for each protocol and epsilon."""
    _, _, flips, calibrated = e11
    assert len(calibrated) == len(flips) * len(LEVELS)
    keys = ["protocol", "epsilon", "rank"]
    both = calibrated.merge(flips, on=keys, suffixes=("", "_flip"), validate="many_to_one")
    np.testing.assert_allclose(both.gap_std, 2 * both.noise_std * both.diff_norm, rtol=1e-12)
    np.testing.assert_allclose(both.sketch_gap, both.sketch_gap_flip, rtol=0)
    assert (both.pair == both.pair_flip).all() and (both.n_draws == 3000).all()
    se = np.sqrt(both.level * (1 - both.level) / 3000)
    np.testing.assert_allclose(both.coverage_se, se, rtol=1e-12)
    assert (np.abs(both.coverage - both.level) < 4 * se).all()
    assert (both.p_resolved_wrong <= (1 - both.level) / 2 + 4 * se).all()


def test_private_rows_against_the_exact_ranking(e11):
    """Whole-ranking and tau agree with a direct recount; the no-noise rows measure the
    sketch KD's error; E9's rows are e9_table's, their std that of KD_avg."""
    inputs, table, _, _ = e11
    exact = table[table.group == "no noise"]
    assert list(exact.dim) == [64, 256] and (exact.rel_error > 0).all()
    assert set(table[table.group == "private KD"].protocol) == {"scores", "sketch", "secure_sketch"}
    kd = {60: {k: inputs[k] for k in ("kd_client", "kd_all", "client_sizes")}}
    e9 = e9_table(kd, epsilons=[0.3, 1.0], delta=1e-5, n_draws=3000, seed=4)
    scores = table[table.protocol == "scores"]
    np.testing.assert_array_equal(scores.p_same_ranking, e9.p_same_ranking)
    np.testing.assert_allclose(scores.noise_std, e9.noise_std / math.sqrt(3), rtol=1e-12)
    for row in table[table.epsilon.notna()].itertuples():
        assert row.p_low <= row.p_same_ranking <= row.p_high
        assert row.p_same_best >= row.p_same_ranking
    fd = table[table.group == "FD"]
    assert fd.rel_error.iloc[0] == pytest.approx(0.01) and fd.mean_kendall_tau.iloc[
        0
    ] == pytest.approx(1)
    assert fd.p_same_ranking.iloc[1] == 0.5 and fd.mean_kendall_tau.iloc[1] == 0.0
    assert (table.loc[table.group != "FD", "bandwidth"] == 2.0).all()


def test_bytes_per_site():
    sizes = [1000] * 14
    assert bytes_per_site("scores", dim=0, n_features=1280, model_sizes=sizes) == (
        14 * 8,
        14 * 1000 * 1280 * 4,
    )
    assert bytes_per_site("fd_moments", dim=0, n_features=1280, model_sizes=sizes) == (
        8 * (1280 + 1280 * 1281 // 2),
        0,
    )
    for protocol in ("sketch", "secure_sketch"):
        assert bytes_per_site(protocol, dim=8192, n_features=1280, model_sizes=sizes) == (65536, 0)


def test_fd_from_moments_is_fd_of_the_rows_and_projects_to_psd():
    x, y = RNG.normal(size=(80, 4)) @ RNG.normal(size=(4, 4)), RNG.normal(1.0, 1.5, size=(60, 4))
    stats = [gaussian_stats(y)]
    got = fd_from_moments(x.sum(0), x.T @ x, len(x), stats)
    assert got[0] == pytest.approx(fd_scipy(x, y), rel=1e-9)
    # a noise that makes the covariance indefinite: FD against its PSD projection
    noise = np.diag([0.0, 0.0, 0.0, -50.0 * (len(x) - 1)]) + 0.3
    cov = np.cov(x, rowvar=False) + noise / (len(x) - 1)
    vals, vecs = np.linalg.eigh(cov)
    psd = (vecs * np.clip(vals, 0, None)) @ vecs.T
    assert vals[0] < 0
    c2, half = np.cov(y, rowvar=False), (vecs * np.sqrt(np.clip(vals, 0, None))) @ vecs.T
    root = np.sqrt(np.clip(linalg.eigvalsh(half @ c2 @ half), 0, None)).sum()
    diff = x.mean(0) - y.mean(0)
    expected = diff @ diff + np.trace(psd) + np.trace(c2) - 2 * root
    got = fd_from_moments(x.sum(0), x.T @ x + noise, len(x), stats)
    assert got[0] == pytest.approx(expected, rel=1e-7)


def test_clipping_and_the_moments_sensitivity():
    """|x|, |x'| <= C: |(x - x', x x^T - x' x'^T)| <= 2 sqrt(C^2 + C^4), its supremum being
    sqrt(2 C^2 + 2 C^4 + 1/2) (at x.x' = -1/2)."""
    x = RNG.normal(size=(500, 6)) * RNG.uniform(0.1, 5, size=(500, 1))
    clipped = clip_rows(x, 2.0)
    norms = np.linalg.norm(x, axis=1)
    np.testing.assert_allclose(np.linalg.norm(clipped, axis=1), np.minimum(norms, 2.0))
    np.testing.assert_array_equal(clipped[norms <= 2.0], x[norms <= 2.0])
    for c in (0.5, 2.0, 40.0):
        rows = clip_rows(x, c)
        a, b = rows[:250], rows[250:]
        outer = np.einsum("ni,nj->nij", a, a) - np.einsum("ni,nj->nij", b, b)
        shift = np.sqrt(((a - b) ** 2).sum(1) + (outer**2).sum((1, 2)))
        bound = moment_sensitivity(c)
        assert shift.max() <= bound and bound == 2 * math.sqrt(c**2 + c**4)
        assert math.sqrt(2 * c**2 + 2 * c**4 + 0.5) <= bound


def test_check_names_the_key():
    config = {
        "models": {"real": {}},
        "partitions": {"p": {}},
        "metrics": {"kd_estimator": "unbiased"},
    }
    settings = {"partition": "p", "bandwidth_from": "real", "dims": [64, 128]}
    check(settings, config)
    with pytest.raises(ValueError, match=r"^config: experiments\.E11\.bandwidth_from 'x'"):
        check({**settings, "bandwidth_from": "x"}, config)
    with pytest.raises(ValueError, match=r"^config: experiments\.E11\.partition is 'q'"):
        check({**settings, "partition": "q"}, config)
    with pytest.raises(ValueError, match=r"^config: experiments\.E11\.dims must increase"):
        check({**settings, "dims": [128, 64]}, config)
    with pytest.raises(ValueError, match=r"^config: experiments\.E11 needs metrics\.kd_esti"):
        check(settings, {**config, "metrics": {"kd_estimator": "biased"}})


def test_files_to_outputs(tmp_path):
    """The pre-steps through the entry point, then run: every table, the figure."""
    x, owner, _ = clustered_clients(RNG, k=3, d=4, sizes=[30, 40, 35])
    names = ["real", "a", "b"]
    np.savez(tmp_path / "reference.npz", features=x)
    save_manifest(tmp_path / "manifest.csv", owner)
    paths = []
    for g, name in enumerate(names):
        paths.append(tmp_path / f"model_{name}.npz")
        np.savez(paths[-1], features=RNG.normal(0.4 * g, 1.0, size=(20, 4)))
    settings = {"client_size": 12, "dims": [16, 64], "epsilons": [1.0, 100.0], "delta": 1e-5}
    settings |= {"n_draws": 20, "bandwidth_from": "real"}
    settings["fd"] = {"clip_norm": 5.0, "epsilons": [10.0], "n_draws": 2}
    inputs = {"reference": tmp_path / "reference.npz", "manifest": tmp_path / "manifest.csv"}
    params = {"models": names, "settings": settings, "seed": 0}
    params |= {"metrics": {"kd_estimator": "unbiased", "dtype": "float64"}, "device": "cpu"}
    files = {"sketches": tmp_path / "sketches.npz", "fd": tmp_path / "fd.npz"}
    for rule, name in (("e11_sketches_centralized", "sketches"), ("e11_fd_private", "fd")):
        run_rule(rule, Job(inputs | {"models": paths}, {name: files[name]}, params))
    with np.load(files["sketches"]) as f:
        assert f["client_sketches"].shape == (3, 64) and list(f["client_sizes"]) == [12] * 3
        assert (np.linalg.norm(f["client_sketches"], axis=1) <= 1.0 + 1e-12).all()
    with np.load(files["fd"]) as f:
        assert f["fd_noisy"].shape == (1, 2, 3) and (f["fd_all"] > 0).all()
    out = run(files, settings, {"seed": 0, "metrics": CONTEXT["metrics"]})
    assert isinstance(out, Outputs) and set(out.figures) == {""}
    assert set(out.tables) == {"", "_flips", "_calibration"}
    table = out.tables[""]
    assert isinstance(table, pd.DataFrame) and len(table) == 2 + 3 * 2 + 2
    assert len(out.tables["_flips"]) == 2 * 2 * 2
    calibrated = out.tables["_calibration"]
    assert len(calibrated) == 2 * 2 * 2 * len(LEVELS)
    assert list(calibrated.level[: len(LEVELS)]) == list(LEVELS)
    assert ((calibrated.coverage >= 0) & (calibrated.coverage <= 1)).all()
    fig = out.figures[""]
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 4 and all(ax.get_xlabel() for ax in axes)
    assert [t.get_text() for t in fig.legends[0].get_texts()][0] == "per-score release (E9)"
    fig.savefig(tmp_path / "e11.png")
