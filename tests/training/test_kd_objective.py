"""The differentiable KD (metrics.kd._sums.KDObjective) and the FedSGD gradient identity."""

import numpy as np
import pytest
import torch

from distrank.metrics._kernels import make_kernel
from distrank.metrics.kd._sums import KDObjective, kernel_sums
from distrank.training.mmd import feature_gradient

KERNELS = [
    ("poly", None),
    ("rbf", {"bandwidth": 2.5}),
    ("laplace", {"bandwidth": 6.0}),
    ("linear", None),
]


def data(seed=0, n=(23, 11, 17), m=13, d=5):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(i, 1.0 + 0.3 * i, size=(k, d)) for i, k in enumerate(n)])
    index = np.repeat(np.arange(len(n)), n)
    y = rng.normal(0.5, 1.2, size=(m, d))
    return x, index, y


def dense_kd(x, y, name, params, estimator):
    """Squared MMD from full Gram matrices written out here (Gretton et al. 2012, eqs. 3, 5)."""

    def gram(a, b):
        if name == "poly":
            return (a @ b.T / a.shape[1] + 1.0) ** 3
        if name == "rbf":
            sq = ((a[:, None] - b[None]) ** 2).sum(-1)
            return torch.exp(-sq / (2 * params["bandwidth"] ** 2))
        if name == "laplace":
            return torch.exp(-(a[:, None] - b[None]).abs().sum(-1) / params["bandwidth"])
        return a @ b.T

    n, m = len(x), len(y)
    kxx, kyy, kxy = gram(x, x), gram(y, y), gram(x, y)
    if estimator == "biased":
        return kxx.mean() + kyy.mean() - 2 * kxy.mean()
    return (
        (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
        + (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
        - 2 * kxy.mean()
    )


@pytest.mark.parametrize("name,params", KERNELS)
@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_values_are_the_scorers_kernel_sums(name, params, estimator):
    x, index, y = data()
    kernel = make_kernel(name, params, x.shape[1])
    objective = KDObjective(x, index, kernel, estimator=estimator, dtype="float64", block_size=8)
    per_client, pooled = objective(torch.from_numpy(y))
    want_client, want_all = kernel_sums(x, index, [y], kernel, dtype="float64", block_size=8).kd(
        estimator
    )
    # the same block sums and formula; only the order of the final k x k sum differs
    # (torch, numpy), so the pooled value may differ in the last bit
    np.testing.assert_allclose(per_client.numpy(), want_client[0], rtol=1e-14, atol=0)
    assert pooled.item() == pytest.approx(want_all[0], rel=1e-14, abs=0)


@pytest.mark.parametrize("name,params", KERNELS)
@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_gradient_equals_autograd_of_dense_gram_matrices(name, params, estimator):
    x, index, y = data(seed=1)
    kernel = make_kernel(name, params, x.shape[1])
    objective = KDObjective(x, index, kernel, estimator=estimator, dtype="float64", block_size=8)
    y_t = torch.from_numpy(y).requires_grad_(True)
    (got,) = torch.autograd.grad(objective(y_t)[1], y_t)
    y_d = torch.from_numpy(y).requires_grad_(True)
    value = dense_kd(torch.from_numpy(x), y_d, name, params, estimator)
    (want,) = torch.autograd.grad(value, y_d)
    assert objective(torch.from_numpy(y))[1].item() == pytest.approx(value.item(), rel=1e-12)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("name,params", KERNELS)
def test_fedsgd_averaged_gradient_is_the_central_gradient(name, params):
    """paper.md, facts: with lambda_i = n_i / n and one shared batch, sum_i lambda_i
    grad KD(X_i, Y) = grad KD(X, Y); each client's objective holds its own rows only."""
    x, index, y = data(seed=2)
    kernel = make_kernel(name, params, x.shape[1])
    sizes = np.bincount(index)
    clients = [
        KDObjective(x[index == i], np.zeros(n, np.int64), kernel, dtype="float64")
        for i, n in enumerate(sizes)
    ]
    pooled = KDObjective(x, np.zeros(len(x), np.int64), kernel, dtype="float64")
    y_t = torch.from_numpy(y)
    fedsgd = feature_gradient(y_t, clients, sizes / sizes.sum())
    central = feature_gradient(y_t, [pooled], [1.0])
    assert fedsgd.dtype == torch.float64
    assert float((fedsgd - central).norm() / central.norm()) < 1e-6  # measured ~1e-15
    uniform = feature_gradient(y_t, clients, np.full(len(sizes), 1 / len(sizes)))
    assert float((uniform - central).norm() / central.norm()) > 1e-2  # lambda_i matters


def test_fedsgd_parameter_gradient_through_a_generator_is_the_central_one(toy, toy_clients):
    """The same identity for the generator's weights (float64 cGAN and embedding), every
    client backpropagating its own loss separately."""
    from distrank.zoo.cgan import Generator

    images, _ = toy
    torch.manual_seed(0)
    gen = Generator(8, 10, 8).double().eval()
    embed = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 6)).double()
    with torch.no_grad():
        x = embed(torch.from_numpy(images[:, None] / 127.5 - 1.0))
    kernel = make_kernel("rbf", {"bandwidth": 1.0}, 6)
    sizes = np.bincount(toy_clients)
    params = list(gen.parameters())
    z = torch.randn(12, 8, dtype=torch.float64)
    c = torch.arange(12) % 10

    def grad(objective):
        return torch.autograd.grad(objective(embed(gen(z, c)))[1], params)

    central = grad(KDObjective(x, np.zeros(len(x), np.int64), kernel, dtype="float64"))
    per_client = [
        grad(KDObjective(x[toy_clients == i], np.zeros(n, np.int64), kernel, dtype="float64"))
        for i, n in enumerate(sizes)
    ]
    lam = sizes / sizes.sum()
    for p, want, *got in zip(params, central, *per_client):
        average = sum(w * g for w, g in zip(lam, got))
        assert float((average - want).norm()) <= 1e-6 * float(want.norm()) + 1e-15, p.shape


def test_boundary_checks():
    x, index, y = data()
    kernel = make_kernel("poly", None, x.shape[1])
    with pytest.raises(ValueError, match=r"^client_index: expected 51 non-negative ints"):
        KDObjective(x, index[:-1], kernel)
    with pytest.raises(ValueError, match=r"^estimator: expected 'unbiased' or 'biased'"):
        KDObjective(x, index, kernel, estimator="subsets")
    objective = KDObjective(x, index, kernel, dtype="float64")
    with pytest.raises(ValueError, match="y: expected a torch tensor"):
        objective(y)
    with pytest.raises(ValueError, match="y has 1 rows"):
        objective(torch.from_numpy(y[:1]))
