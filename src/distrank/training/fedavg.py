r"""FedAvg training of the zoo's class-conditional GAN, and its central baseline (E5).

Round r: every client i starts from the global generator G and discriminator D, runs
``local_steps`` steps of the zoo's cGAN training (:func:`~distrank.zoo.cgan.train_step`:
hinge loss, Adam at two time scales) on its own images only, and the server replaces
both networks by the weighted average of the clients' ones,

.. math::
    (G, D) \leftarrow \sum_i \lambda_i (G_i, D_i), \qquad \lambda_i = n_i / n,

FedAvg (McMahan et al., AISTATS 2017) applied to both networks of a GAN as in FedGAN
(Rasouli et al., arXiv 2006.07228). Every floating tensor of the networks is averaged:
weights, BatchNorm running statistics and the spectral-norm power-iteration vectors.
Clients keep their own Adam states across rounds (cross-silo clients, which hold their
data for the whole training), and draw batches and latents from their own seeded
streams.

The central baseline (:func:`train_cgan_central`) is the same loop with one client
holding the pool and ``k * local_steps`` steps per round: the same optimiser steps,
batch size and images seen as the federation, and a checkpoint at the same points.
Both start from the same initial networks (built under the same seed).

``server_momentum`` > 0 makes the server step FedAvgM's (Hsu et al., 2019;
:func:`~distrank.training.federated.momentum_step`): the averaged update of the
networks' parameters is added to a velocity that decays by that factor. On clients
that hold different classes, each client's Adam steps point different ways and their
average is short; the velocity restores the length of the steps that agree.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence

import numpy as np
import torch

from distrank._checks import positive_int
from distrank._io import array_digest
from distrank._progress import progress
from distrank.training.federated import (
    Shard,
    average_states,
    client_seed,
    momentum_step,
    shard_weights,
    training_device,
    training_session,
)
from distrank.training.resume import Checkpoints
from distrank.zoo.cgan import Discriminator, Generator, train_cgan, train_step
from distrank.zoo.families import check_labels, to_float

__all__ = ["train_cgan_central", "train_cgan_fedavg", "zoo_defaults"]

log = logging.getLogger(__name__)


class _Client:
    """A client's networks, optimisers, data and random stream (batches and latents)."""

    def __init__(
        self, shard: Shard, seed: int, config: dict, lr_g: float, lr_d: float, device: torch.device
    ):
        self.x = to_float(shard.images).to(device)
        self.y = torch.from_numpy(shard.labels).to(device)
        self.gen = Generator(
            config["z_dim"], config["n_classes"], config["width"], config["side"]
        ).to(device)
        self.disc = Discriminator(config["n_classes"], config["width"], config["side"]).to(device)
        self.opt_g = torch.optim.Adam(self.gen.parameters(), lr=lr_g, betas=(0.0, 0.9))
        self.opt_d = torch.optim.Adam(self.disc.parameters(), lr=lr_d, betas=(0.0, 0.9))
        self.rng = torch.Generator().manual_seed(seed)
        self.order, self.pos = torch.randperm(len(shard), generator=self.rng), 0
        self.z_dim, self.device = config["z_dim"], device

    def train(
        self, generator: dict, discriminator: dict, steps: int, batch_size: int, bar
    ) -> list[tuple[float, float]]:
        """``steps`` local steps from the global networks; returns the losses."""
        self.gen.load_state_dict(generator)
        self.disc.load_state_dict(discriminator)
        losses = []
        for _ in range(steps):
            if self.pos + batch_size > len(self.order):  # a new epoch, as the zoo does
                self.order, self.pos = torch.randperm(len(self.order), generator=self.rng), 0
            idx = self.order[self.pos : self.pos + batch_size].to(self.device)
            self.pos += batch_size
            z = torch.randn(batch_size, self.z_dim, generator=self.rng).to(self.device)
            losses.append(
                train_step(self.gen, self.disc, self.opt_g, self.opt_d, self.x[idx], self.y[idx], z)
            )
            bar.update()
        return losses

    def state(self) -> dict:
        return {
            "opt_g": self.opt_g.state_dict(),
            "opt_d": self.opt_d.state_dict(),
            "rng": self.rng.get_state(),
            "order": self.order,
            "pos": self.pos,
        }

    def load(self, state: dict) -> None:
        """Continue from :meth:`state` (optimiser tensors move to the parameters' device)."""
        self.opt_g.load_state_dict(state["opt_g"])
        self.opt_d.load_state_dict(state["opt_d"])
        self.rng.set_state(state["rng"])
        self.order, self.pos = state["order"], int(state["pos"])


def _cpu(state: dict) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def zoo_defaults() -> dict:
    """batch_size, z_dim, width, lr_g and lr_d of :func:`distrank.zoo.cgan.train_cgan`,
    their one home."""
    params = inspect.signature(train_cgan).parameters
    return {k: params[k].default for k in ("batch_size", "z_dim", "width", "lr_g", "lr_d")}


def train_cgan_fedavg(
    shards: Sequence[Shard],
    *,
    seed: int,
    rounds: int,
    local_steps: int,
    checkpoint_dir,
    batch_size: int | None = None,
    z_dim: int | None = None,
    width: int | None = None,
    lr_g: float | None = None,
    lr_d: float | None = None,
    n_classes: int | None = None,
    server_momentum: float = 0.0,
    threads: int = 2,
    device=None,
    desc: str = "fedavg cgan",
) -> list[dict]:
    """Train the zoo's cGAN with FedAvg across ``shards`` (one per client; module doc).

    Parameters
    ----------
    shards : sequence of Shard
        The clients' images and labels
        (:func:`~distrank.training.federated.client_shards`).
    seed : int
        Seeds the initial networks (``training_session(seed)``) and every client's
        stream (:func:`~distrank.training.federated.client_seed`).
    rounds, local_steps : int
        Communication rounds; steps per client per round.
    checkpoint_dir : str or os.PathLike
        The job's :class:`~distrank.training.resume.Checkpoints` folder
        (outside its Snakemake outputs); a rerun resumes after the last round saved.
    batch_size, z_dim, width : int, optional
        As in :func:`distrank.zoo.cgan.train_cgan` (None: its defaults,
        :func:`zoo_defaults`); ``batch_size`` may not exceed the smallest shard.
    lr_g, lr_d : float, optional
        Likewise: the generator's and the discriminator's Adam learning rates.
    n_classes : int, optional
        Default ``max label + 1`` over all shards.
    server_momentum : float
        FedAvgM's velocity decay in [0, 1) (0: plain FedAvg; module doc).
    threads : int
        Intra-op CPU threads.
    device : str or torch.device, optional
        Torch device (None: CUDA when available).
    desc : str
        Label of the progress bar and the log lines.

    Returns
    -------
    list of dict
        One zoo state per round (``family="cgan"``, ``config``, ``generator``,
        ``history``, ``round``), as :func:`distrank.zoo.sample` reads it.

    Raises
    ------
    ValueError
        No shards, a shard smaller than ``batch_size``, labels outside
        ``0..n_classes-1``, or ``server_momentum`` outside [0, 1).
    """
    given = {"batch_size": batch_size, "z_dim": z_dim, "width": width, "lr_g": lr_g, "lr_d": lr_d}
    settings = zoo_defaults() | {k: v for k, v in given.items() if v is not None}
    batch_size, z_dim, width = settings["batch_size"], settings["z_dim"], settings["width"]
    lr_g, lr_d = settings["lr_g"], settings["lr_d"]
    rounds = positive_int(rounds, "rounds")
    local_steps = positive_int(local_steps, "local_steps")
    batch_size = positive_int(batch_size, "batch_size")
    n_classes = _check_shards(shards, batch_size, n_classes)
    side = int(shards[0].images.shape[-1])
    config = {"z_dim": z_dim, "width": width, "n_classes": n_classes, "side": side}
    lam = shard_weights(shards)
    dev = training_device(device)
    run = {"seed": seed, "rounds": rounds, "local_steps": local_steps, "batch_size": batch_size}
    if not 0 <= server_momentum < 1:
        raise ValueError(f"server_momentum: expected a number in [0, 1), got {server_momentum!r}")
    run |= {"config": config, "lr_g": lr_g, "lr_d": lr_d, "threads": threads}
    run |= {"server_momentum": server_momentum} if server_momentum else {}
    store = _checkpoints(checkpoint_dir, shards, dev, **run)
    with training_session(seed, threads, dev):
        gen = Generator(z_dim, n_classes, width, config["side"]).to(dev)
        disc = Discriminator(n_classes, width, config["side"]).to(dev)
        clients = [
            _Client(s, client_seed(seed, i), config, lr_g, lr_d, dev) for i, s in enumerate(shards)
        ]
        done, history, *networks = _resume(store, clients, gen.state_dict(), disc.state_dict(), dev)
        names = [f"g.{k}" for k, _ in gen.named_parameters()]
        names += [f"d.{k}" for k, _ in disc.named_parameters()]
        per_round = local_steps * len(shards)
        with progress(total=rounds * per_round, desc=desc, unit="step") as bar:
            bar.update(done * per_round)
            for r in range(done + 1, rounds + 1):
                losses = [c.train(*networks[:2], local_steps, batch_size, bar) for c in clients]
                networks = _server_step(clients, lam, networks, server_momentum, names)
                d_loss, g_loss = _record(history, r, losses)
                log.info("%s round %d/%d: d_loss %.4f g_loss %.4f", desc, r, rounds, d_loss, g_loss)
                _save_round(store, r, config, networks, clients, history)
    return [store.load(r) for r in range(1, rounds + 1)]


def _checkpoints(checkpoint_dir, shards: Sequence[Shard], dev, **run) -> Checkpoints:
    """The job's checkpoint store, keyed by everything that determines the run."""
    return Checkpoints(
        checkpoint_dir,
        {
            "trainer": "train_cgan_fedavg",
            **run,
            "device": dev.type,
            "data": [array_digest(s.images, s.labels) for s in shards],
        },
    )


def _check_shards(shards: Sequence[Shard], batch_size: int, n_classes: int | None) -> int:
    """Raise unless every shard holds a batch of uint8 images with labels in
    ``0..n_classes-1``; returns ``n_classes`` (default: max label + 1)."""
    if not shards:
        raise ValueError("shards: expected at least one client")
    for i, shard in enumerate(shards):
        if len(shard) < batch_size:
            raise ValueError(f"batch_size ({batch_size}) exceeds client {i}'s {len(shard)} images")
    if n_classes is None:
        n_classes = int(max(s.labels.max() for s in shards)) + 1
    for shard in shards:
        check_labels(shard.labels, len(shard), n_classes)
        to_float(shard.images[:1])  # checks uint8 (N, H, W)
    return n_classes


def _server_step(clients, lam, networks, server_momentum: float, names) -> tuple:
    """The server's step of a round: the clients' weighted average of both networks, as
    FedAvgM's step when ``server_momentum`` is set. ``networks`` is (generator,
    discriminator, velocity or None); returns the new three."""
    generator, discriminator, velocity = networks
    averaged = _joined(
        average_states([c.gen.state_dict() for c in clients], lam),
        average_states([c.disc.state_dict() for c in clients], lam),
    )
    if server_momentum:
        averaged, velocity = momentum_step(
            _joined(generator, discriminator), averaged, velocity, server_momentum, names
        )
    return (*_split(averaged), velocity)


def _joined(generator: dict, discriminator: dict) -> dict:
    """Both networks' states in one dict (keys ``g.<name>``, ``d.<name>``)."""
    return {f"g.{k}": v for k, v in generator.items()} | {
        f"d.{k}": v for k, v in discriminator.items()
    }


def _split(joined: dict) -> tuple[dict, dict]:
    """The inverse of :func:`_joined`."""
    nets = {"g": {}, "d": {}}
    for key, value in joined.items():
        nets[key[0]][key[2:]] = value
    return nets["g"], nets["d"]


def _resume(store: Checkpoints, clients, generator: dict, discriminator: dict, dev):
    """(rounds done, history, generator, discriminator, server velocity): the fresh
    start given, or the last round saved (whose client states are loaded into
    ``clients``)."""
    history = {"round": [], "d_loss": [], "g_loss": []}
    resumed = store.resume()
    if resumed is None:
        return 0, history, generator, discriminator, None
    # the same dict literal as a fresh run: equal objects pickle to equal bytes
    history = {
        "round": list(resumed["history"]["round"]),
        "d_loss": list(resumed["history"]["d_loss"]),
        "g_loss": list(resumed["history"]["g_loss"]),
    }
    generator = {k: v.to(dev) for k, v in resumed["generator"].items()}
    discriminator = {k: v.to(dev) for k, v in resumed["discriminator"].items()}
    for client, state in zip(clients, resumed["clients"]):
        client.load(state)
    velocity = resumed.get("velocity")
    velocity = None if velocity is None else {k: v.to(dev) for k, v in velocity.items()}
    return int(resumed["point"]), history, generator, discriminator, velocity


def _record(history: dict, r: int, losses) -> tuple[float, float]:
    """Append round ``r`` and its mean losses over every client's steps to ``history``."""
    d_loss, g_loss = np.mean([step for client in losses for step in client], axis=0)
    history["round"].append(r)
    history["d_loss"].append(float(d_loss))
    history["g_loss"].append(float(g_loss))
    return d_loss, g_loss


def _save_round(store: Checkpoints, r: int, config, networks, clients, history):
    """Checkpoint round ``r``: the zoo state, and what a rerun resumes from
    (``networks``: generator, discriminator and server velocity or None)."""
    generator, discriminator, velocity = networks
    checkpoint = {
        "family": "cgan",
        "config": config,
        "generator": _cpu(generator),
        "history": history,
        "round": r,
    }
    store.save(
        r,
        checkpoint,
        {
            "generator": checkpoint["generator"],
            "discriminator": _cpu(discriminator),
            "clients": [c.state() for c in clients],
            "history": history,
        }
        | ({} if velocity is None else {"velocity": _cpu(velocity)}),
    )


def train_cgan_central(shards: Sequence[Shard], *, local_steps: int, **kwargs) -> list[dict]:
    """The central baseline of :func:`train_cgan_fedavg` (same arguments): the shards
    pooled into one client that runs ``len(shards) * local_steps`` steps per round.

    Parameters
    ----------
    shards : sequence of Shard
        The clients' images and labels, pooled in order.
    local_steps : int
        Steps per client per round of the federation it matches.
    **kwargs
        Those of :func:`train_cgan_fedavg`; ``desc`` defaults to "central cgan", and
        ``server_momentum`` is dropped (one client).

    Returns
    -------
    list of dict
        One zoo state per round, as :func:`train_cgan_fedavg` returns them.
    """
    if not shards:
        raise ValueError("shards: expected at least one client")
    pool = Shard(
        np.concatenate([s.images for s in shards]), np.concatenate([s.labels for s in shards])
    )
    kwargs.setdefault("desc", "central cgan")
    kwargs.pop("server_momentum", None)  # one client: its own steps, unamplified
    return train_cgan_fedavg(
        [pool], local_steps=len(shards) * positive_int(local_steps, "local_steps"), **kwargs
    )
