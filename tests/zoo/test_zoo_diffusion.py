"""Class-conditional diffusion model with classifier-free guidance (distrank.zoo.diffusion)."""

import math

import numpy as np
import pytest
import torch

from distrank.zoo import load_state, save_state
from distrank.zoo.diffusion import _ddim, sample_diffusion, train_diffusion

TINY = {"steps": 6, "batch_size": 32, "width": 8, "log_every": 3}


@pytest.fixture(scope="module")
def state(toy):
    return train_diffusion(*toy, seed=0, **TINY)


def test_tiny_training_runs_and_is_deterministic(toy, state):
    assert state["family"] == "diffusion"
    assert state["config"] == {"width": 8, "n_classes": 10, "side": 28}
    assert state["history"]["step"] == [3, 6]
    assert np.all(np.isfinite(state["history"]["loss"]))
    again = train_diffusion(*toy, seed=0, **TINY)
    assert again["history"] == state["history"]
    assert all(torch.equal(v, again["generator"][k]) for k, v in state["generator"].items())
    other = train_diffusion(*toy, seed=1, **TINY)
    assert other["history"] != state["history"]


def test_samples_are_byte_identical_under_a_seed(tmp_path, state):
    save_state(tmp_path / "d.pt", state)
    loaded = load_state(tmp_path / "d.pt")
    images, labels = sample_diffusion(state, 30, seed=2, guidance=2.0, sample_steps=4)
    assert images.shape == (30, 28, 28) and images.dtype == np.uint8
    assert labels.dtype == np.int64 and np.array_equal(labels, np.arange(30) % 10)
    again, _ = sample_diffusion(loaded, 30, seed=2, guidance=2.0, sample_steps=4, batch_size=7)
    assert images.tobytes() == again.tobytes()
    assert not np.array_equal(
        images, sample_diffusion(state, 30, seed=3, guidance=2.0, sample_steps=4)[0]
    )
    empty, none = sample_diffusion(state, 0, seed=0)
    assert empty.shape == (0, 28, 28) and none.shape == (0,)


@pytest.mark.parametrize("guidance", [0.0, 1.0, 2.0])
def test_a_small_batch_is_denoised_in_whole_network_calls(state, monkeypatch, guidance):
    """A batch below 200 rows would pad every 200-row network call (E4's 300 images at
    the study's batch of 64: 5 calls a step, not 3 or 2); rounded up to whole calls,
    the samples are the same bytes whatever the batch (450 images: 200 + 200 + 50 or
    400 + 50 rows)."""
    from distrank.zoo import diffusion

    calls = []
    forward = diffusion.UNet.forward
    monkeypatch.setattr(
        diffusion.UNet,
        "forward",
        lambda self, x, t, y: calls.append(len(x)) or forward(self, x, t, y),
    )
    kw = {"seed": 4, "guidance": guidance, "sample_steps": 2}
    small, _ = sample_diffusion(state, 300, batch_size=64, **kw)
    per_step = 3 if guidance not in (0.0, 1.0) else 2  # 600 or 300 rows in 200-row calls
    assert calls == [200] * per_step * 2
    for batch in (7, 200, 400, 1000):
        again, _ = sample_diffusion(state, 300, batch_size=batch, **kw)
        assert again.tobytes() == small.tobytes(), batch
    big = [sample_diffusion(state, 450, batch_size=b, **kw)[0] for b in (200, 400)]
    assert big[0].tobytes() == big[1].tobytes()


def test_labels_are_respected_and_checked(state):
    want = np.array([3, 3, 1, 0, 9])
    _, labels = sample_diffusion(state, 5, seed=0, labels=want, sample_steps=2)
    assert np.array_equal(labels, want)
    with pytest.raises(ValueError, match=r"^argument 'labels' must lie in 0\.\.9$"):
        sample_diffusion(state, 2, seed=0, labels=[0, 10])


class _Oracle(torch.nn.Module):
    """The exact v-prediction for data that is one image per condition.

    For x_t = a x0 + s eps with a single possible x0, v = a eps - s x0 = (a x_t - x0) / s.
    """

    def __init__(self, targets):
        super().__init__()
        self.targets = targets  # condition -> (1, H, W) image

    def forward(self, x, t, y):
        a, s = torch.cos(t * math.pi / 2), torch.sin(t * math.pi / 2)
        x0 = self.targets[y]
        return (a[:, None, None, None] * x - x0) / s[:, None, None, None]


@pytest.mark.parametrize("guidance", [0.0, 0.5, 1.0, 2.0, 4.0])
def test_ddim_with_an_exact_network_lands_on_the_guided_image(guidance):
    """With the oracle, x0_hat is the target at every step; guidance mixes the
    unconditional and conditional predictions linearly, so DDIM must end exactly at
    clip(x0_null + w (x0_cond - x0_null), -1, 1) from any noise."""
    gen = torch.Generator().manual_seed(0)
    targets = torch.rand(3, 1, 6, 6, generator=gen, dtype=torch.float64) * 1.6 - 0.8
    net = _Oracle(targets)  # conditions 0, 1; 2 = no class
    noise = torch.randn(4, 1, 6, 6, generator=gen, dtype=torch.float64)
    y = torch.tensor([0, 1, 1, 0])
    times = torch.linspace(1.0, 0.0, 9, dtype=torch.float64)
    out = _ddim(net, noise, y, times, guidance, 2)
    want = (targets[2] + guidance * (targets[y] - targets[2])).clamp(-1, 1)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


def test_guidance_reduces_within_class_spread(toy):
    """A model trained a little longer: guided samples of one class vary less."""
    state = train_diffusion(*toy, seed=0, steps=150, batch_size=32, width=8, log_every=50)

    def spread(guidance):
        images, _ = sample_diffusion(
            state, 64, seed=1, guidance=guidance, sample_steps=8, labels=np.full(64, 4)
        )
        return images.astype(float).var(axis=0).mean()

    assert spread(4.0) < spread(1.0)


def test_bad_inputs(toy, state):
    images, labels = toy
    with pytest.raises(ValueError, match=r"^argument 'images' must be uint8"):
        train_diffusion(images.astype(float), labels, seed=0, **TINY)
    with pytest.raises(ValueError, match=r"^argument 'labels' must be 160 ints"):
        train_diffusion(images, labels[:-1], seed=0, **TINY)
    with pytest.raises(ValueError, match=r"^argument 'batch_size' \(32\) exceeds the 10 images$"):
        train_diffusion(images[:10], labels[:10], seed=0, **TINY)
    with pytest.raises(ValueError, match=r"^argument 'p_uncond' must lie in "):
        train_diffusion(images, labels, seed=0, p_uncond=1.0, **TINY)
    with pytest.raises(ValueError, match=r"^argument 'ema_decay' must lie in "):
        train_diffusion(images, labels, seed=0, ema_decay=1.0, **TINY)
    with pytest.raises(ValueError, match=r"^argument 'guidance' must be >= 0"):
        sample_diffusion(state, 2, seed=0, guidance=-1.0)
    with pytest.raises(ValueError, match=r"^argument 'sample_steps' must be an int >= 1"):
        sample_diffusion(state, 2, seed=0, sample_steps=0)
