"""A small class-conditional VAE with a temperature knob.

Encoder: two strided convolutions, then (features, one-hot class) -> (mu, log var).
Decoder: (z, one-hot class) -> 7x7 -> 14x14 -> 28x28 Bernoulli logits. The prior is
class-conditional, p(z | y) = N(m_y, I) with a learned mean per class, so the latent
need not carry the class and samples keep to their label. Trained on the negative
ELBO with pixels in [0, 1] as Bernoulli targets (Kingma & Welling, 2014).
A sample is the decoder's mean image at z ~ N(m_y, temperature^2 I): temperature < 1
trades diversity for typicality, temperature 0 gives one image per class.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from distrank.zoo import torch_session
from distrank.zoo.families import (
    LossLog,
    in_batches,
    load_network,
    quarter_side,
    sample_labels,
    shuffled_batches,
    to_float,
    training_labels,
)

__all__ = ["VAE", "train_vae", "sample_vae"]


class VAE(nn.Module):
    def __init__(self, z_dim: int, n_classes: int, width: int, side: int = 28):
        super().__init__()
        self.n_classes, self.width, self.base = n_classes, width, quarter_side(side)
        hidden = 2 * width * self.base**2
        self.encoder = nn.Sequential(
            nn.Conv2d(1, width, 4, 2, 1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 4, 2, 1),
            nn.ReLU(),
            nn.Flatten(),
        )
        self.to_latent = nn.Linear(hidden + n_classes, 2 * z_dim)
        self.prior_mean = nn.Embedding(n_classes, z_dim)
        nn.init.zeros_(self.prior_mean.weight)
        self.from_latent = nn.Linear(z_dim + n_classes, hidden)
        self.decoder = nn.Sequential(
            nn.ReLU(),
            nn.ConvTranspose2d(2 * width, width, 4, 2, 1),
            nn.ReLU(),
            nn.ConvTranspose2d(width, 1, 4, 2, 1),
        )

    def encode(self, x, y):
        h = torch.cat([self.encoder(x), F.one_hot(y, self.n_classes).float()], dim=1)
        return self.to_latent(h).chunk(2, dim=1)

    def decode(self, z, y):
        """Bernoulli logits (N, 1, H, W)."""
        h = self.from_latent(torch.cat([z, F.one_hot(y, self.n_classes).float()], dim=1))
        return self.decoder(h.view(-1, 2 * self.width, self.base, self.base))


def train_vae(
    images,
    labels,
    *,
    seed: int,
    steps: int = 800,
    batch_size: int = 128,
    z_dim: int = 16,
    width: int = 32,
    lr: float = 1e-3,
    n_classes: int | None = None,
    log_every: int = 50,
    threads: int = 2,
) -> dict:
    """Train the conditional VAE on uint8 images (N, H, W) and int labels.

    Parameters
    ----------
    steps, batch_size : int
        Adam steps and batch size.
    z_dim, width : int
        Latent size; channels of the first convolution (the second has ``2*width``).
    lr : float
        Adam learning rate.
    n_classes : int, optional
        Number of classes; default ``max(labels) + 1``.
    log_every : int
        Steps between the mean losses (negative ELBO per image, nats) in ``history``.

    Returns
    -------
    dict
        The state: ``family="vae"``, ``config``, ``generator`` (the VAE's state dict),
        ``history``.
    """
    x_all = to_float(images).add_(1.0).div_(2.0)  # Bernoulli targets in [0, 1]
    y_all, n_classes = training_labels(x_all, labels, n_classes, batch_size)
    config = {"z_dim": z_dim, "width": width, "n_classes": n_classes, "side": x_all.shape[-1]}
    losses = LossLog("vae", steps, log_every, ("loss",))
    with torch_session(seed, threads):
        vae = VAE(z_dim, n_classes, width, config["side"])
        opt = torch.optim.Adam(vae.parameters(), lr=lr)
        rng = torch.Generator().manual_seed(seed)
        batches = shuffled_batches(len(x_all), batch_size, rng)
        for step, idx in zip(range(1, steps + 1), batches):
            x, y = x_all[idx], y_all[idx]

            mu, logvar = vae.encode(x, y)
            z = mu + torch.randn(mu.shape, generator=rng) * (0.5 * logvar).exp()
            recon = F.binary_cross_entropy_with_logits(vae.decode(z, y), x, reduction="sum")
            kl = 0.5 * ((mu - vae.prior_mean(y)) ** 2 + logvar.exp() - 1 - logvar).sum()
            loss = (recon + kl) / batch_size
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

            losses.add(step, loss=loss.item())
    return {
        "family": "vae",
        "config": config,
        "generator": vae.state_dict(),
        "history": losses.history,
    }


@torch.no_grad()
def sample_vae(
    state: dict,
    n: int,
    *,
    seed: int,
    temperature: float = 1.0,
    labels=None,
    batch_size: int = 1000,
    threads: int = 2,
):
    """Draw ``n`` images: decoder means at z ~ N(m_y, temperature^2 I).

    ``labels`` defaults to balanced classes, ``arange(n) % n_classes``.
    Returns (images uint8 (n, H, W), labels int64 (n,)).
    """
    if not temperature >= 0:
        raise ValueError(f"argument 'temperature' must be >= 0, got {temperature!r}")
    cfg = state["config"]
    labels = sample_labels(labels, n, cfg["n_classes"])
    with torch_session(seed, threads):
        vae = load_network(VAE, state)
        y = torch.from_numpy(labels)
        eps = torch.randn(n, cfg["z_dim"], generator=torch.Generator().manual_seed(seed))
        z = vae.prior_mean(y) + temperature * eps
        images = in_batches(
            lambda a, b: (
                torch.sigmoid(vae.decode(z[a:b], y[a:b]))
                .squeeze(1)
                .mul(255)
                .round()
                .to(torch.uint8)
                .numpy()
            ),
            n,
            batch_size,
            cfg["side"],
        )
    return images, labels
