"""A small class-conditional DCGAN with BigGAN's truncation trick.

Generator: (z, an embedding of the class) -> 7x7 -> 14x14 -> 28x28, batch-normed
transposed convolutions, tanh output. Discriminator: three convolutions with spectral
normalisation, a minibatch standard-deviation feature (Karras et al., 2018: it lets the
discriminator see a collapsed batch, so the generator keeps using its latent) and a
projection head for the class (Miyato & Koyama, 2018). Trained with
the hinge loss and Adam at two time scales. Sampling draws z from a normal truncated to
``[-truncation, truncation]`` per coordinate (Brock et al., 2019): a lower truncation
trades diversity for fidelity, the knob the paper's variance-limited experiments turn.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from distrank.zoo import torch_session
from distrank.zoo.families import (
    LossLog,
    in_batches,
    load_network,
    quarter_side,
    sample_labels,
    shuffled_batches,
    to_float,
    to_uint8,
    training_labels,
)

__all__ = [
    "Generator",
    "Discriminator",
    "minibatch_std",
    "truncated_normal",
    "train_step",
    "train_cgan",
    "sample_cgan",
]


class Generator(nn.Module):
    def __init__(self, z_dim: int, n_classes: int, width: int, side: int = 28):
        super().__init__()
        self.z_dim, self.width, self.base = z_dim, width, quarter_side(side)
        self.embed = nn.Embedding(n_classes, z_dim)
        self.fc = nn.Linear(2 * z_dim, 2 * width * self.base**2)
        self.net = nn.Sequential(
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.ConvTranspose2d(2 * width, width, 4, 2, 1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.ConvTranspose2d(width, 1, 4, 2, 1),
            nn.Tanh(),
        )

    def forward(self, z, y):
        h = self.fc(torch.cat([z, self.embed(y)], dim=1))
        return self.net(h.view(-1, 2 * self.width, self.base, self.base))


class Discriminator(nn.Module):
    def __init__(self, n_classes: int, width: int, side: int = 28):
        super().__init__()
        self.net = nn.Sequential(
            spectral_norm(nn.Conv2d(1, width, 4, 2, 1)),
            nn.LeakyReLU(0.2),
            spectral_norm(nn.Conv2d(width, 2 * width, 4, 2, 1)),
            nn.LeakyReLU(0.2),
            spectral_norm(nn.Conv2d(2 * width, 2 * width, 3, 1, 1)),
            nn.LeakyReLU(0.2),
            nn.Flatten(),
        )
        features = 2 * width * (side // 4) ** 2
        self.out = spectral_norm(nn.Linear(features + 1, 1))
        self.embed = spectral_norm(nn.Embedding(n_classes, features))

    def forward(self, x, y):
        h = self.net(x)
        # Projection head: unconditional score plus <class embedding, features>.
        scores = self.out(torch.cat([h, minibatch_std(h)], dim=1)).squeeze(1)
        return scores + (self.embed(y) * h).sum(dim=1)


def minibatch_std(h: torch.Tensor, group: int = 4) -> torch.Tensor:
    """(N, 1): the mean over features of their standard deviation within each group of
    ``group`` consecutive rows (one group when N is not a multiple), given to every row
    of the group. Training passes real and fake rows in separate halves of a multiple of
    ``group``, so no group mixes them."""
    n = len(h)
    group = group if n % group == 0 else n
    spread = h.view(n // group, group, -1).var(dim=1, unbiased=False).add(1e-8).sqrt()
    return spread.mean(dim=1).repeat_interleave(group).unsqueeze(1)


def truncated_normal(n: int, dim: int, truncation: float | None, generator) -> torch.Tensor:
    """Standard normal (n, dim), each coordinate redrawn until ``|z| <= truncation``.

    ``truncation=None`` means no truncation.
    """
    z = torch.randn(n, dim, generator=generator)
    if truncation is None:
        return z
    if not truncation > 0:
        raise ValueError(f"argument 'truncation' must be > 0 or None, got {truncation!r}")
    while (outside := z.abs() > truncation).any():
        z[outside] = torch.randn(int(outside.sum()), generator=generator)
    return z


def train_step(gen, disc, opt_g, opt_d, x, y, z) -> tuple[float, float]:
    """One step of the cGAN training: a discriminator, then a generator update.

    Hinge loss (Lim & Ye, 2017; Miyato et al., 2018): D minimises
    ``mean(relu(1 - D(x))) + mean(relu(1 + D(G(z))))`` on real ``x`` and fakes of the
    same labels ``y``, then G minimises ``-mean(D(G(z)))``. Returns (d_loss, g_loss).
    """
    fake = gen(z, y)
    # One pass over real and fake (the discriminator has no batch statistics).
    d_real, d_fake = disc(torch.cat([x, fake.detach()]), torch.cat([y, y])).chunk(2)
    d_loss = torch.relu(1 - d_real).mean() + torch.relu(1 + d_fake).mean()
    opt_d.zero_grad(set_to_none=True)
    d_loss.backward()
    opt_d.step()

    g_loss = -disc(fake, y).mean()
    opt_g.zero_grad(set_to_none=True)
    g_loss.backward()
    opt_g.step()
    return d_loss.item(), g_loss.item()


def train_cgan(
    images,
    labels,
    *,
    seed: int,
    steps: int = 1500,
    batch_size: int = 64,
    z_dim: int = 64,
    width: int = 32,
    lr_g: float = 1e-4,
    lr_d: float = 4e-4,
    n_classes: int | None = None,
    log_every: int = 50,
    threads: int = 2,
) -> dict:
    """Train the conditional GAN on uint8 images (N, H, W) and int labels.

    Parameters
    ----------
    steps, batch_size : int
        Optimiser steps (one discriminator and one generator update each) and batch size.
    z_dim, width : int
        Latent size; channels of the narrowest hidden layer (the others have ``2*width``).
    lr_g, lr_d : float
        Adam learning rates of generator and discriminator (betas 0, 0.9; the faster
        discriminator is the two-time-scale rule of Heusel et al., 2017).
    n_classes : int, optional
        Number of classes; default ``max(labels) + 1``.
    log_every : int
        Steps between the mean losses recorded in ``history``.

    Returns
    -------
    dict
        The state: ``family="cgan"``, ``config`` (what :func:`sample_cgan` needs),
        ``generator`` (state dict of tensors), ``history`` (mean losses per interval).
    """
    x_all = to_float(images)
    y_all, n_classes = training_labels(x_all, labels, n_classes, batch_size)
    config = {"z_dim": z_dim, "width": width, "n_classes": n_classes, "side": x_all.shape[-1]}
    losses = LossLog("cgan", steps, log_every, ("d_loss", "g_loss"))
    with torch_session(seed, threads):
        gen = Generator(z_dim, n_classes, width, config["side"])
        disc = Discriminator(n_classes, width, config["side"])
        opt_g = torch.optim.Adam(gen.parameters(), lr=lr_g, betas=(0.0, 0.9))
        opt_d = torch.optim.Adam(disc.parameters(), lr=lr_d, betas=(0.0, 0.9))
        rng = torch.Generator().manual_seed(seed)
        batches = shuffled_batches(len(x_all), batch_size, rng)
        for step, idx in zip(range(1, steps + 1), batches):
            z = torch.randn(batch_size, z_dim, generator=rng)
            d_loss, g_loss = train_step(gen, disc, opt_g, opt_d, x_all[idx], y_all[idx], z)
            losses.add(step, d_loss=d_loss, g_loss=g_loss)
    return {
        "family": "cgan",
        "config": config,
        "generator": gen.state_dict(),
        "history": losses.history,
    }


@torch.no_grad()
def sample_cgan(
    state: dict,
    n: int,
    *,
    seed: int,
    truncation: float | None = None,
    psi: float = 1.0,
    labels=None,
    batch_size: int = 1000,
    threads: int = 2,
):
    """Draw ``n`` images from a trained state.

    Parameters
    ----------
    truncation : float or None
        Bound on every latent coordinate (``None``: plain normal latents).
    psi : float
        Scale of the latents, ``z -> psi z`` (StyleGAN's truncation psi about the mean
        latent, here 0): below 1 less diverse; above 1 it extrapolates past the
        training distribution, more diverse and less typical.
    labels : array of int, optional
        Class of each sample; default balanced, ``arange(n) % n_classes``.
    batch_size : int
        Forward-pass batch; it changes memory use, not the samples.

    Returns
    -------
    (images uint8 (n, H, W), labels int64 (n,))
    """
    cfg = state["config"]
    labels = sample_labels(labels, n, cfg["n_classes"])
    with torch_session(seed, threads):
        gen = load_network(Generator, state)
        z = truncated_normal(n, cfg["z_dim"], truncation, torch.Generator().manual_seed(seed))
        if not psi >= 0:
            raise ValueError(f"argument 'psi' must be >= 0, got {psi!r}")
        z = z * psi
        y = torch.from_numpy(labels)
        images = in_batches(lambda a, b: to_uint8(gen(z[a:b], y[a:b])), n, batch_size, cfg["side"])
    return images, labels
