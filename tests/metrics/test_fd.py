"""Frechet distance: closed forms, scipy's sqrtm, and pooled statistics from client statistics."""

import numpy as np
import pytest
import scipy.linalg
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import ortho_group

from distrank.metrics import score
from distrank.metrics.fd import (
    GaussianStats,
    frechet_distance,
    frechet_distances,
    frechet_terms,
    gaussian_stats,
    pool_stats,
)
from distrank.metrics.fd._frechet import factored

RNG = np.random.default_rng(1982)


def scipy_fd(mean1, cov1, mean2, cov2):
    """FD with scipy.linalg.sqrtm, as in the reference FID code (Heusel et al. 2017)."""
    covmean = scipy.linalg.sqrtm(cov1 @ cov2).real
    return float(np.sum((mean1 - mean2) ** 2) + np.trace(cov1 + cov2 - 2 * covmean))


def random_spd(d, rng=RNG):
    a = rng.normal(size=(d, 2 * d))
    return a @ a.T / (2 * d)


def stats(mean, cov, n=100):
    return GaussianStats(n, np.asarray(mean, float), np.asarray(cov, float))


def test_commuting_covariances_match_the_closed_form():
    d = 9
    q = ortho_group.rvs(d, random_state=3)
    a, b = RNG.uniform(0.1, 3, d), RNG.uniform(0.1, 3, d)
    m1, m2 = RNG.normal(size=d), RNG.normal(size=d)
    s1, s2 = stats(m1, q * a @ q.T), stats(m2, q * b @ q.T)
    expected = np.sum((m1 - m2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert frechet_distance(s1, s2) == pytest.approx(expected, rel=1e-12)


def test_general_covariances_match_scipy_sqrtm():
    d = 16
    m1, m2 = RNG.normal(size=d), RNG.normal(0.5, 1, size=d)
    c1, c2 = random_spd(d), random_spd(d)
    expected = scipy_fd(m1, c1, m2, c2)
    assert frechet_distance(stats(m1, c1), stats(m2, c2)) == pytest.approx(expected, rel=1e-10)
    assert frechet_distance(stats(m2, c2), stats(m1, c1)) == pytest.approx(expected, rel=1e-10)


def test_rank_one_covariance_matches_the_closed_form():
    # C1 = u u^T: C1^1/2 = u u^T / |u|, so tr (C1^1/2 C2 C1^1/2)^1/2 = sqrt(u^T C2 u)
    d = 12
    u = RNG.normal(size=d)
    c2 = random_spd(d)
    m1, m2 = RNG.normal(size=d), RNG.normal(size=d)
    expected = np.sum((m1 - m2) ** 2) + u @ u + np.trace(c2) - 2 * np.sqrt(u @ c2 @ u)
    got = [
        frechet_distance(stats(m1, np.outer(u, u)), stats(m2, c2)),
        frechet_distance(stats(m2, c2), stats(m1, np.outer(u, u))),
    ]
    assert got == pytest.approx([expected, expected], rel=1e-10)


def test_both_rank_deficient_rotated_covariances_match_the_closed_form():
    d = 10
    q = ortho_group.rvs(d, random_state=11)
    a = np.r_[np.zeros(6), RNG.uniform(0.5, 2, 4)]  # rank 4
    b = np.r_[np.zeros(3), RNG.uniform(0.5, 2, 7)]  # rank 7, support contains a's
    s1, s2 = stats(np.zeros(d), q * a @ q.T), stats(np.ones(d), q * b @ q.T)
    expected = d + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)
    assert frechet_distance(s1, s2) == pytest.approx(expected, rel=1e-10)
    assert frechet_distance(s2, s1) == pytest.approx(expected, rel=1e-10)
    zero = stats(np.zeros(d), np.zeros((d, d)))
    assert frechet_distance(zero, s2) == pytest.approx(d + b.sum(), rel=1e-12)


@pytest.mark.parametrize("n,m", [(5, 200), (50, 60), (300, 40)])
def test_fewer_rows_than_features_match_the_nuclear_norm_form(n, m):
    # With C1 = A^T A and C2 = B^T B (A, B the centred rows scaled by 1/sqrt(rows-1)),
    # tr (C1^1/2 C2 C1^1/2)^1/2 is the sum of the singular values of A B^T: an
    # independent, exact form for rank-deficient covariances (scipy's sqrtm is
    # ~1e-8 off on these).
    d = 100 if n > 5 else 8
    x, y = RNG.normal(size=(n, d)), RNG.normal(0.2, 1.3, size=(m, d))
    a = (x - x.mean(axis=0)) / np.sqrt(n - 1)
    b = (y - y.mean(axis=0)) / np.sqrt(m - 1)
    expected = (
        np.sum((x.mean(axis=0) - y.mean(axis=0)) ** 2)
        + np.sum(a * a)
        + np.sum(b * b)
        - 2 * np.linalg.svd(a @ b.T, compute_uv=False).sum()
    )
    sx, sy = gaussian_stats(x), gaussian_stats(y)
    assert (sx.factor is not None, sy.factor is not None) == (n <= d, m <= d)  # rows kept
    assert frechet_distance(sx, sy) == pytest.approx(expected, rel=1e-12)
    assert frechet_distance(sy, sx) == pytest.approx(expected, rel=1e-12)
    bare = [GaussianStats(s.n, s.mean, s.cov) for s in (sx, sy)]  # the eigh factor instead
    assert frechet_distance(*bare) == pytest.approx(expected, rel=1e-12)


def test_factors_with_zeros_skip_them_and_keep_the_values(monkeypatch):
    """References' factors have zeros above their diagonal (kept rows as R^T of a QR,
    Cholesky), models' zeros below the diagonal of their bottom block (``factored``,
    reversed Cholesky); the block products and Gram matrices that skip them, with 7
    columns a block here, give the nuclear-norm root (numpy's SVD) for every pair of
    structures, full factors (an ``eigh``'s) and factors of the other role included."""
    import distrank.metrics.fd._bands as banded
    import distrank.metrics.fd._frechet as fd_module

    monkeypatch.setattr(banded, "_STEP", 7)
    d = 30
    draws = [RNG.normal(size=(20, d)), RNG.normal(0.2, 1.3, size=(25, d))]
    draws += [RNG.normal(size=(200, d)), RNG.normal(0.5, 0.8, size=(90, d))]  # n > d
    kept = [((s - s.mean(axis=0)) / np.sqrt(len(s) - 1)).T for s in draws[:2]]
    sx, sy, sf, sg = (gaussian_stats(s) for s in draws)
    tx, ty = factored([sx, sy])
    for s, t in ((sx, tx), (sy, ty)):
        r = t.factor.shape[1]
        assert not np.tril(t.factor, r - d - 1).any() and t.cov is None
        np.testing.assert_allclose(t.factor @ t.factor.T, s.factor @ s.factor.T, atol=1e-12)
    chol = np.linalg.cholesky(sg.cov)
    rank_deficient = sf.cov - np.outer(sf.cov[0], sf.cov[0]) / sf.cov[0, 0]  # eigh's factor
    w, v = np.linalg.eigh(rank_deficient)
    square_root = v[:, 1:] * np.sqrt(w[1:])  # its zero eigenvalue dropped
    refs = [sx, tx, sf, GaussianStats(500, sf.mean, rank_deficient)]
    models = [
        sy,
        ty,
        sg,
        GaussianStats(sg.n, sg.mean, None, chol),
        GaussianStats(500, sf.mean, rank_deficient),
    ]
    ref_factors = [kept[0], tx.factor, np.linalg.cholesky(sf.cov), square_root]
    model_factors = [kept[1], ty.factor, chol, chol, square_root]
    root = frechet_terms(refs, models).root
    cpu, made = torch.device("cpu"), fd_module._FACTORS
    bands = [made[s][cpu, False][1] for s in refs] + [made[s][cpu, True][1] for s in models]
    lower, upper, full = banded.LOWER, banded._upper, banded.FULL
    expected = [lower, upper(d, 20), lower, full]  # the references'
    expected += [upper(d, 25), upper(d, 25), upper(d, d), lower, full]  # the models'
    assert bands == expected
    for r, a in enumerate(ref_factors):
        for g, b in enumerate(model_factors):
            expected = np.linalg.svd(a.T @ b, compute_uv=False).sum()
            assert root[r, g] == pytest.approx(expected, rel=1e-12), (r, g)


def test_terms_are_the_closed_form_parts_and_sum_to_fd():
    """mean = |m1 - m2|^2, the traces, and root = sum of the singular values of
    A B^T (the nuclear-norm form above), for references x models; FD is their sum."""
    xs = [RNG.normal(size=(n, 6)) for n in (4, 40)]
    ys = [RNG.normal(0.5, 1.2, size=(m, 6)) for m in (5, 30, 300)]
    terms = frechet_terms([gaussian_stats(x) for x in xs], [gaussian_stats(y) for y in ys])
    for r, x in enumerate(xs):
        for g, y in enumerate(ys):
            a = (x - x.mean(axis=0)) / np.sqrt(len(x) - 1)
            b = (y - y.mean(axis=0)) / np.sqrt(len(y) - 1)
            got = [t[r, g] for t in (terms.mean, terms.trace_reference, terms.trace_model)]
            expected = [np.sum((x.mean(0) - y.mean(0)) ** 2), np.sum(a * a), np.sum(b * b)]
            np.testing.assert_allclose(got, expected, rtol=1e-12)
            nuclear = np.linalg.svd(a @ b.T, compute_uv=False).sum()
            assert terms.root[r, g] == pytest.approx(nuclear, rel=1e-12)
    refs, models = [gaussian_stats(x) for x in xs], [gaussian_stats(y) for y in ys]
    np.testing.assert_array_equal(terms.fd, frechet_distances(refs, models))


def test_gaussian_stats_equal_numpy_in_blocks():
    x = RNG.normal(3.0, 2.0, size=(103, 7))
    s = gaussian_stats(x, block_size=10)
    assert s.n == 103
    np.testing.assert_allclose(s.mean, x.mean(axis=0), rtol=1e-13)
    np.testing.assert_allclose(s.cov, np.cov(x, rowvar=False, ddof=1), rtol=1e-12, atol=1e-14)
    x32 = x.astype(np.float32)
    s32 = gaussian_stats(x32, block_size=10)  # float32 input, float64 statistics
    np.testing.assert_allclose(s32.cov, np.cov(x32.astype(np.float64), rowvar=False), rtol=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(2, 20), min_size=1, max_size=6),
    d=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_pooled_stats_equal_stats_of_pooled_rows(sizes, d, seed):
    rng = np.random.default_rng(seed)
    parts = [
        rng.normal(rng.normal(scale=3, size=d), rng.uniform(0.2, 2), size=(n, d)) for n in sizes
    ]
    pooled = pool_stats([gaussian_stats(p) for p in parts])
    direct = gaussian_stats(np.concatenate(parts))
    assert pooled.n == direct.n
    np.testing.assert_allclose(pooled.mean, direct.mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(pooled.cov, direct.cov, rtol=1e-10, atol=1e-12)


def test_score_fd_all_from_client_stats_equals_fd_on_pooled_features():
    d = 6
    clients = RNG.integers(0, 4, size=400)
    x = RNG.normal(size=(400, d)) + RNG.normal(scale=2, size=(4, d))[clients]
    models = {"a": RNG.normal(size=(150, d)), "b": RNG.normal(1.0, 2.0, size=(90, d))}
    table = score(x, clients, models, metrics=["fd"], dtype="float64")
    rows = table.set_index(["model", "aggregation", "client"]).value
    for name, y in models.items():
        my, cy = y.mean(axis=0), np.cov(y, rowvar=False)
        expected = scipy_fd(x.mean(axis=0), np.cov(x, rowvar=False), my, cy)
        assert rows[name, "all", ""] == pytest.approx(expected, rel=1e-9)
        xc = x[clients == 2]
        assert rows[name, "client", "2"] == pytest.approx(
            scipy_fd(xc.mean(axis=0), np.cov(xc, rowvar=False), my, cy), rel=1e-9
        )


def test_fd_matrix_equals_pairwise_calls():
    refs = [gaussian_stats(RNG.normal(size=(n, 5))) for n in (4, 30)]
    models = [gaussian_stats(RNG.normal(0.3, 1.5, size=(m, 5))) for m in (3, 50, 8)]
    table = frechet_distances(refs, models)
    assert table.shape == (2, 3)
    for r, a in enumerate(refs):
        for g, b in enumerate(models):
            assert table[r, g] == pytest.approx(frechet_distance(a, b), rel=1e-12)


def test_bad_fd_inputs_are_named():
    with pytest.raises(ValueError, match="x: 1 row; a covariance"):
        gaussian_stats(np.ones((1, 3)))
    with pytest.raises(ValueError, match="x: contains NaN"):
        gaussian_stats(np.array([[0.0, np.nan], [1.0, 2.0]]))
    with pytest.raises(ValueError, match="dimensions differ"):
        frechet_distance(stats(np.zeros(2), np.eye(2)), stats(np.zeros(3), np.eye(3)))
    with pytest.raises(ValueError, match=r"clients: client '1' has 1 row; FD"):
        score(RNG.normal(size=(4, 2)), [0, 0, 0, 1], {"g": RNG.normal(size=(5, 2))}, metrics=["fd"])


def test_each_client_factor_is_computed_once_for_all_models(monkeypatch):
    import distrank.metrics.fd._frechet as fd_module

    calls, sqrt_factor = [], fd_module.sqrt_factor

    def counting(cov, **kwargs):
        calls.append(tuple(cov.shape))
        return sqrt_factor(cov, **kwargs)

    monkeypatch.setattr(fd_module, "sqrt_factor", counting)
    rng = np.random.default_rng(5)
    x, clients = rng.normal(size=(90, 4)), np.repeat([0, 1, 2], 30)
    models = {f"g{i}": rng.normal(0.1 * i, 1.0, size=(40, 4)) for i in range(4)}
    table = score(x, clients, models, metrics=["fd"], dtype="float64")
    # the 4 models, the 3 clients and the pool, each factored once
    assert calls == [(4, 4)] * 8
    for name, y in models.items():
        rows = table[(table.model == name) & (table.aggregation == "client")]
        for c in range(3):
            part = x[clients == c]
            expected = scipy_fd(
                part.mean(0), np.cov(part, rowvar=False), y.mean(0), np.cov(y, rowvar=False)
            )
            assert rows[rows.client == str(c)].value.item() == pytest.approx(expected, rel=1e-9)
