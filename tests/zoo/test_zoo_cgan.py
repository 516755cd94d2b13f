"""Class-conditional GAN (distrank.zoo.cgan)."""

import numpy as np
import pytest
import torch

from distrank.zoo import load_state, save_state
from distrank.zoo.cgan import sample_cgan, train_cgan, truncated_normal

TINY = {"steps": 4, "batch_size": 32, "width": 8, "z_dim": 8, "log_every": 2}


@pytest.fixture(scope="module")
def state(toy):
    return train_cgan(*toy, seed=0, **TINY)


def test_tiny_training_runs_with_finite_losses(state):
    history = state["history"]
    assert history["step"] == [2, 4]
    assert np.all(np.isfinite(history["d_loss"])) and np.all(np.isfinite(history["g_loss"]))
    assert state["config"] == {"z_dim": 8, "width": 8, "n_classes": 10, "side": 28}


def test_training_is_deterministic(toy, state):
    again = train_cgan(*toy, seed=0, **TINY)
    assert again["history"] == state["history"]
    for k, v in state["generator"].items():
        assert torch.equal(v, again["generator"][k]), k


def test_samples_are_byte_identical_under_a_seed(tmp_path, state):
    save_state(tmp_path / "g.pt", state)
    loaded = load_state(tmp_path / "g.pt")
    images, labels = sample_cgan(state, 50, seed=3, truncation=1.0)
    again, _ = sample_cgan(loaded, 50, seed=3, truncation=1.0, batch_size=7)
    assert images.shape == (50, 28, 28) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and np.array_equal(labels, np.arange(50) % 10)
    assert images.tobytes() == again.tobytes()
    assert not np.array_equal(images, sample_cgan(state, 50, seed=4, truncation=1.0)[0])


def test_labels_are_respected(state):
    want = np.array([3, 3, 1, 0, 9])
    _, labels = sample_cgan(state, 5, seed=0, labels=want)
    assert np.array_equal(labels, want)
    with pytest.raises(ValueError, match=r"^argument 'labels' must lie in 0\.\.9$"):
        sample_cgan(state, 2, seed=0, labels=[0, 10])


def test_truncation_bounds_latents_and_reduces_diversity(state):
    z = truncated_normal(5000, 8, 0.5, torch.Generator().manual_seed(0))
    assert z.abs().max() <= 0.5
    # Standard deviation of N(0,1) truncated to [-0.5, 0.5]: sqrt(1 - 2 a phi(a) / (2 Phi(a) - 1)).
    assert z.std().item() == pytest.approx(0.2816, abs=0.005)
    assert truncated_normal(5000, 8, None, torch.Generator().manual_seed(0)).abs().max() > 3

    def within_class_variance(truncation):
        images, _ = sample_cgan(
            state, 400, seed=1, truncation=truncation, labels=np.zeros(400, int)
        )
        return images.astype(float).var(axis=0).mean()

    spread = [within_class_variance(t) for t in (None, 1.0, 0.2)]
    assert spread[0] > spread[1] > spread[2]
    with pytest.raises(ValueError, match=r"^argument 'truncation' must be > 0"):
        sample_cgan(state, 2, seed=0, truncation=0)


def test_bad_inputs(toy):
    images, labels = toy
    with pytest.raises(ValueError, match=r"^argument 'images' must be uint8"):
        train_cgan(images.astype(float), labels, seed=0, **TINY)
    with pytest.raises(ValueError, match=r"^argument 'labels' must be 160 ints"):
        train_cgan(images, labels[:-1], seed=0, **TINY)
    with pytest.raises(ValueError, match=r"^argument 'batch_size' \(32\) exceeds the 10 images$"):
        train_cgan(images[:10], labels[:10], seed=0, **TINY)
