r"""A small class-conditional diffusion model with classifier-free guidance.

Forward process (variance preserving, cosine schedule of Nichol & Dhariwal, 2021, in
the continuous form of Salimans & Ho, 2022): for an image :math:`x_0` in [-1, 1] and
:math:`t \in [0, 1]`,

.. math::
    x_t = \alpha_t x_0 + \sigma_t \epsilon, \qquad \alpha_t = \cos(\pi t / 2), \quad
    \sigma_t = \sin(\pi t / 2), \quad \epsilon \sim N(0, I).

The network predicts the velocity :math:`v = \alpha_t \epsilon - \sigma_t x_0`
("v-prediction", Salimans & Ho, "Progressive Distillation for Fast Sampling of
Diffusion Models", ICLR 2022), so :math:`\hat x_0 = \alpha_t x_t - \sigma_t \hat v`.
Training minimises :math:`\lVert \hat v - v \rVert^2` at :math:`t \sim U(0, 1)`; the
class label is replaced by a "no class" token with probability ``p_uncond``, so the one
network is both conditional and unconditional (Ho & Salimans, "Classifier-Free
Diffusion Guidance", 2022). The weights used for sampling are an exponential moving
average of the trained ones.

Sampling is DDIM with :math:`\eta = 0` (Song et al., "Denoising Diffusion Implicit
Models", ICLR 2021): deterministic given the initial noise, on ``sample_steps`` equal
steps from :math:`t = 1` to :math:`0`; one step from :math:`t` to :math:`s < t` is

.. math::
    x_s = \alpha_s \hat x_0 + \frac{\sigma_s}{\sigma_t} (x_t - \alpha_t \hat x_0),

with :math:`\hat x_0` clipped to [-1, 1]. Guidance with scale :math:`w` mixes the
unconditional and the conditional prediction, :math:`\hat v = \hat v_\varnothing +
w (\hat v_y - \hat v_\varnothing)`: :math:`w = 0` ignores the class, :math:`w = 1` is the
plain conditional model, and :math:`w > 1` trades diversity for typicality, the knob
that E4 turns.

Network: a two-level U-Net of residual blocks with group norm on the image folded to
4 x 14 x 14 (``pixel_unshuffle``), down to 7 px; the time (sinusoidal features) and
class embeddings are added inside every block.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from distrank.zoo import torch_session
from distrank.zoo.families import (
    LossLog,
    in_batches,
    sample_labels,
    shuffled_batches,
    to_float,
    to_uint8,
    training_labels,
)

#: Rows of every network call when sampling (see :func:`_predict`).
_CHUNK = 200

__all__ = ["UNet", "train_diffusion", "sample_diffusion"]


def _alpha_sigma(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cosine schedule: (alpha_t, sigma_t) = (cos, sin)(pi t / 2)."""
    angle = t * (math.pi / 2)
    return torch.cos(angle), torch.sin(angle)


class _Block(nn.Module):
    """Residual block: norm, SiLU, conv; plus the embedding; norm, SiLU, conv."""

    def __init__(self, c_in: int, c_out: int, emb_dim: int, groups: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(groups, c_in), nn.Conv2d(c_in, c_out, 3, 1, 1)
        self.emb = nn.Linear(emb_dim, c_out)
        self.norm2, self.conv2 = nn.GroupNorm(groups, c_out), nn.Conv2d(c_out, c_out, 3, 1, 1)
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x, emb):
        h = self.conv1(F.silu(self.norm1(x))) + self.emb(emb)[:, :, None, None]
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)))


class UNet(nn.Module):
    """v-prediction network: (x_t (N,1,H,W), t (N,), class (N,) with ``n_classes`` = none).

    The image is folded into 4 channels at half the side (``pixel_unshuffle``, lossless),
    so the convolutions run at 14 and 7 px, and unfolded at the end.
    """

    def __init__(self, n_classes: int, width: int, side: int = 28):
        super().__init__()
        if side % 4:
            raise ValueError(f"image side must be a multiple of 4, got {side}")
        c1, c2, emb_dim, groups = width, 2 * width, 4 * width, min(8, width)
        self.width = width
        self.time_mlp = nn.Sequential(
            nn.Linear(width, emb_dim), nn.SiLU(), nn.Linear(emb_dim, emb_dim)
        )
        self.class_emb = nn.Embedding(n_classes + 1, emb_dim)  # last row: no class
        self.stem = nn.Conv2d(4, c1, 3, 1, 1)
        self.down1 = _Block(c1, c1, emb_dim, groups)
        self.pool = nn.Conv2d(c1, c2, 4, 2, 1)  # 14 -> 7 px
        self.down2 = _Block(c2, c2, emb_dim, groups)
        self.mid = _Block(c2, c2, emb_dim, groups)
        self.up2 = _Block(2 * c2, c2, emb_dim, groups)
        self.up1 = _Block(c2 + c1, c1, emb_dim, groups)
        self.out = nn.Sequential(nn.GroupNorm(groups, c1), nn.SiLU(), nn.Conv2d(c1, 4, 3, 1, 1))

    def _time_features(self, t):
        half = self.width // 2
        freqs = torch.exp(-math.log(1000.0) * torch.arange(half, dtype=t.dtype) / half)
        angles = 1000.0 * t[:, None] * freqs[None, :]
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    def forward(self, x, t, y):
        emb = self.time_mlp(self._time_features(t)) + self.class_emb(y)
        h1 = self.down1(self.stem(F.pixel_unshuffle(x, 2)), emb)  # 14 px
        h2 = self.down2(self.pool(h1), emb)  # 7 px
        h = self.up2(torch.cat([self.mid(h2, emb), h2], dim=1), emb)
        h = self.up1(torch.cat([F.interpolate(h, scale_factor=2.0), h1], dim=1), emb)
        return F.pixel_shuffle(self.out(h), 2)


def train_diffusion(
    images,
    labels,
    *,
    seed: int,
    steps: int = 2000,
    batch_size: int = 64,
    width: int = 32,
    lr: float = 2e-3,
    p_uncond: float = 0.1,
    ema_decay: float = 0.995,
    n_classes: int | None = None,
    log_every: int = 50,
    threads: int = 2,
) -> dict:
    """Train the conditional diffusion model on uint8 images (N, H, W) and int labels.

    Parameters
    ----------
    steps, batch_size : int
        Adam steps and batch size.
    width : int
        Channels at full resolution (``2*width`` at 14 and 7 px).
    lr : float
        Peak Adam learning rate, reached after a linear warm-up over the first 5 % of
        the steps and decayed along a cosine to 0 at the last step.
    p_uncond : float
        Probability of dropping a training label (classifier-free guidance).
    ema_decay : float
        Decay of the moving average of the weights that sampling uses; it is
        ``min(ema_decay, (1 + step) / (10 + step))`` at each step.
    n_classes : int, optional
        Number of classes; default ``max(labels) + 1``.
    log_every : int
        Steps between the mean losses (squared error in v per pixel) in ``history``.

    Returns
    -------
    dict
        The state: ``family="diffusion"``, ``config``, ``generator`` (the moving-average
        network's state dict), ``history``.
    """
    x_all = to_float(images)
    y_all, n_classes = training_labels(x_all, labels, n_classes, batch_size)
    if not 0 <= p_uncond < 1:
        raise ValueError(f"argument 'p_uncond' must lie in [0, 1), got {p_uncond!r}")
    if not 0 <= ema_decay < 1:
        raise ValueError(f"argument 'ema_decay' must lie in [0, 1), got {ema_decay!r}")
    config = {"width": width, "n_classes": n_classes, "side": x_all.shape[-1]}
    losses = LossLog("diffusion", steps, log_every, ("loss",))
    warmup = max(1, steps // 20)
    with torch_session(seed, threads):
        net = UNet(n_classes, width, config["side"])
        ema = UNet(n_classes, width, config["side"])
        ema.load_state_dict(net.state_dict())
        ema.requires_grad_(False)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda i: min((i + 1) / warmup, 0.5 * (1 + math.cos(math.pi * i / steps)))
        )
        rng = torch.Generator().manual_seed(seed)
        batches = shuffled_batches(len(x_all), batch_size, rng)
        for step, idx in zip(range(1, steps + 1), batches):
            y = y_all[idx].clone()
            y[torch.rand(batch_size, generator=rng) < p_uncond] = n_classes  # unconditional
            loss = _v_loss(net, x_all[idx], y, rng)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            _ema_update(ema, net, min(ema_decay, (1 + step) / (10 + step)))
            losses.add(step, loss=loss.item())
    return {
        "family": "diffusion",
        "config": config,
        "generator": ema.state_dict(),
        "history": losses.history,
    }


def _v_loss(net: UNet, x0: torch.Tensor, y: torch.Tensor, rng) -> torch.Tensor:
    """Mean squared error of the network's v-prediction at times and noise drawn from ``rng``."""
    t = torch.rand(len(x0), generator=rng)
    eps = torch.randn(x0.shape, generator=rng)
    alpha, sigma = (a[:, None, None, None] for a in _alpha_sigma(t))
    return F.mse_loss(net(alpha * x0 + sigma * eps, t, y), alpha * eps - sigma * x0)


@torch.no_grad()
def _ema_update(ema: UNet, net: UNet, decay: float) -> None:
    for p_ema, p in zip(ema.parameters(), net.parameters()):
        p_ema.lerp_(p, 1 - decay)


@torch.no_grad()
def sample_diffusion(
    state: dict,
    n: int,
    *,
    seed: int,
    guidance: float = 1.0,
    labels=None,
    sample_steps: int = 10,
    batch_size: int = 500,
    threads: int = 2,
):
    """Draw ``n`` images with the DDIM sampler (eta 0) and classifier-free guidance.

    Parameters
    ----------
    guidance : float
        Guidance scale w >= 0 (0: unconditional, 1: conditional, > 1: guided).
    labels : array of int, optional
        Class of each sample; default balanced, ``arange(n) % n_classes``.
    sample_steps : int
        DDIM steps from pure noise (t = 1) to the image (t = 0).
    batch_size : int
        Images denoised together, rounded up to a multiple of the rows of one network
        call (200): a smaller batch would only pad every call. It changes memory use,
        not the samples.

    Returns
    -------
    (images uint8 (n, H, W), labels int64 (n,))
    """
    if not guidance >= 0:
        raise ValueError(f"argument 'guidance' must be >= 0, got {guidance!r}")
    if isinstance(sample_steps, bool) or not isinstance(sample_steps, int) or sample_steps < 1:
        raise ValueError(f"argument 'sample_steps' must be an int >= 1, got {sample_steps!r}")
    cfg = state["config"]
    labels = sample_labels(labels, n, cfg["n_classes"])
    batch_size = -(-batch_size // _CHUNK) * _CHUNK  # whole network calls
    with torch_session(seed, threads):
        net = UNet(cfg["n_classes"], cfg["width"], cfg["side"])
        net.load_state_dict(state["generator"])
        net.eval()
        shape = (n, 1, cfg["side"], cfg["side"])
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        y = torch.from_numpy(labels)
        times = torch.linspace(1.0, 0.0, sample_steps + 1)
        images = in_batches(
            lambda a, b: to_uint8(
                _ddim(net, noise[a:b], y[a:b], times, guidance, cfg["n_classes"])
            ),
            n,
            batch_size,
            cfg["side"],
        )
    return images, labels


def _ddim(net, x, y, times, guidance, null_class):
    """DDIM (eta 0) from x at times[0] = 1 to times[-1] = 0 (see the module doc)."""
    null = torch.full_like(y, null_class)
    for t, s in zip(times[:-1], times[1:]):
        t_batch = t.expand(len(x))
        if guidance == 1:
            v = _predict(net, x, t_batch, y)
        elif guidance == 0:
            v = _predict(net, x, t_batch, null)
        else:  # one pass over the conditional and the unconditional copy
            v_cond, v_null = _predict(
                net, torch.cat([x, x]), torch.cat([t_batch, t_batch]), torch.cat([y, null])
            ).chunk(2)
            v = v_null + guidance * (v_cond - v_null)
        (alpha_t, sigma_t), (alpha_s, sigma_s) = _alpha_sigma(t), _alpha_sigma(s)
        x0 = (alpha_t * x - sigma_t * v).clamp(-1.0, 1.0)
        x = alpha_s * x0 + (sigma_s / sigma_t) * (x - alpha_t * x0)
    return x


def _predict(net, x, t, y):
    """``net(x, t, y)`` in calls of exactly ``_CHUNK`` rows, the last one padded.

    The convolutions' rounding depends on the batch shape; with one shape for every
    call, a sample does not depend on the batch it is drawn in.
    """
    n, pad = len(x), -len(x) % _CHUNK
    if pad:
        x, t, y = (torch.cat([a, a[:1].expand(pad, *a.shape[1:])]) for a in (x, t, y))
    return torch.cat(
        [
            net(x[i : i + _CHUNK], t[i : i + _CHUNK], y[i : i + _CHUNK])
            for i in range(0, n + pad, _CHUNK)
        ]
    )[:n]
