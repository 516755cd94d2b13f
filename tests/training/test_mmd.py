"""MMD fine-tuning (training.mmd): FedSGD is central training, step for step."""

import numpy as np
import pytest
import torch

from distrank.metrics._kernels import make_kernel
from distrank.metrics.kd._sums import KDObjective
from distrank.training.mmd import Lite0Embedding, finetune_mmd, latent_batches
from distrank.zoo import sample
from distrank.zoo.cgan import train_cgan
from distrank.zoo.families import to_float


@pytest.fixture(scope="module")
def setup(toy, toy_clients):
    images, labels = toy
    state = train_cgan(images, labels, seed=0, steps=20, batch_size=16, z_dim=8, width=8, threads=1)
    torch.manual_seed(0)
    embedding = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 8)).eval()
    embedding.requires_grad_(False)
    with torch.no_grad():
        reference = embedding(to_float(images))
    kernel = make_kernel("rbf", {"bandwidth": 2.0}, 8)
    return state, embedding, reference, toy_clients, kernel


def run(setup, method, tmp_path, **kw):
    state, embedding, reference, clients, kernel = setup
    options = {
        "seed": 1,
        "steps": 6,
        "batch_size": 16,
        "lr": 1e-2,
        "eval_every": 2,
        "local_steps": 2,
        "threads": 1,
    } | kw
    return finetune_mmd(
        state,
        reference,
        clients,
        method=method,
        kernel=kernel,
        embedding=embedding,
        checkpoint_dir=tmp_path / method,
        **options,
    )


def weights(state):
    return torch.cat(
        [v.flatten().double() for v in state["generator"].values() if v.is_floating_point()]
    )


def test_fedsgd_and_central_agree_step_for_step_and_fedavg_does_not(setup, tmp_path):
    central, fedsgd, fedavg = (run(setup, m, tmp_path) for m in ("central", "fedsgd", "fedavg"))
    assert [p for p, _ in central] == [p for p, _ in fedsgd] == [0, 2, 4, 6]
    start = weights(central[0][1])
    for (_, a), (_, b), (_, c) in zip(central[1:], fedsgd[1:], fedavg[1:]):
        moved = float((weights(a) - start).norm())
        assert moved > 1e-3
        # FedSGD's average differs from the central gradient by float64 rounding only
        assert float((weights(a) - weights(b)).abs().max()) <= 1e-6
        assert float((weights(a) - weights(c)).norm()) > 1e-3 * moved


def test_fine_tuning_lowers_the_pooled_kd(setup, tmp_path):
    state, embedding, reference, _, kernel = setup
    pooled = KDObjective(reference, np.zeros(len(reference), np.int64), kernel, dtype="float64")
    none = run(setup, "none", tmp_path)
    assert [p for p, _ in none] == [0]

    def kd(s):
        images, _ = sample(s, 200, seed=9)
        with torch.no_grad():
            return pooled(embedding(to_float(images)))[1].item()

    start = kd(none[0][1])
    for method in ("central", "fedsgd", "fedavg"):
        assert kd(run(setup, method, tmp_path)[-1][1]) < start, method


def test_latent_batches_are_seeded_and_shared():
    z, c = latent_batches(seed=3, steps=4, batch_size=5, z_dim=2, n_classes=10)
    z2, c2 = latent_batches(seed=3, steps=4, batch_size=5, z_dim=2, n_classes=10)
    assert z.shape == (4, 5, 2) and c.shape == (4, 5) and int(c.max()) < 10
    assert torch.equal(z, z2) and torch.equal(c, c2)


def test_argument_checks(setup, tmp_path):
    with pytest.raises(ValueError, match=r"^method: expected one of "):
        run(setup, "sgd", tmp_path)
    with pytest.raises(ValueError, match=r"steps \(6\) must be a multiple of eval_every \(4\)"):
        run(setup, "central", tmp_path, eval_every=4)
    with pytest.raises(ValueError, match="multiple of local_steps"):
        run(setup, "fedavg", tmp_path, local_steps=4)


def test_lite0_embedding_is_the_feature_step_on_saved_samples():
    """On images already on the uint8 grid, the differentiable embedding gives the
    features of the pipeline's EfficientNet-Lite0 extractor (torch backend)."""
    from distrank.features import get_extractor

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    embedding = Lite0Embedding()
    x = to_float(images).requires_grad_(True)
    got = embedding(x)
    got.sum().backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
    want = get_extractor("efficientnet_lite0", backend="torch", device="cpu").extract(
        images[..., None]
    )
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-4, atol=1e-4)
