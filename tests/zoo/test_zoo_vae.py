"""Class-conditional VAE (distrank.zoo.vae)."""

import numpy as np
import pytest
import torch

from distrank.zoo.vae import sample_vae, train_vae

TINY = {"steps": 6, "batch_size": 32, "width": 8, "z_dim": 4, "log_every": 3}


@pytest.fixture(scope="module")
def state(toy):
    return train_vae(*toy, seed=0, **TINY)


def test_tiny_training_runs_and_is_deterministic(toy, state):
    assert state["history"]["step"] == [3, 6]
    assert np.all(np.isfinite(state["history"]["loss"]))
    again = train_vae(*toy, seed=0, **TINY)
    assert again["history"] == state["history"]
    assert all(torch.equal(v, again["generator"][k]) for k, v in state["generator"].items())


def test_samples_are_byte_identical_under_a_seed(state):
    images, labels = sample_vae(state, 30, seed=2, temperature=0.8)
    assert images.shape == (30, 28, 28) and images.dtype == np.uint8
    assert np.array_equal(labels, np.arange(30) % 10)
    assert (
        images.tobytes()
        == sample_vae(state, 30, seed=2, temperature=0.8, batch_size=4)[0].tobytes()
    )
    assert not np.array_equal(images, sample_vae(state, 30, seed=3, temperature=0.8)[0])


def test_temperature_controls_diversity(state):
    def within_class_variance(temperature):
        images, _ = sample_vae(state, 300, seed=1, temperature=temperature, labels=np.full(300, 4))
        return images.astype(float).var(axis=0).mean()

    spread = [within_class_variance(t) for t in (1.5, 0.5, 0.0)]
    assert spread[0] > spread[1] > spread[2] == 0
    with pytest.raises(ValueError, match=r"^argument 'temperature' must be >= 0"):
        sample_vae(state, 2, seed=0, temperature=-1)
