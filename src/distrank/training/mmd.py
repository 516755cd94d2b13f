r"""Fine-tuning a trained generator with a squared-MMD loss, centrally or across clients (E7).

The loss of a generated batch is its kernel distance to reference data,

.. math::
    L_X(\theta) = \mathrm{KD}\bigl(X, \phi(G_\theta(z, c))\bigr),

the unbiased squared MMD with one fixed kernel (a bandwidth fixed once, before
training), in the feature space of a fixed differentiable embedding :math:`\phi`
(MMD training: Li et al., "Generative Moment Matching Networks", ICML 2015; Dziugaite
et al., UAI 2015). KD comes from the package's own block sums, differentiable
(``KDObjective``): one implementation for scoring and
training.

Every method takes the same number of generator steps T on the same latent batches
:math:`(z_t, c_t)`, drawn once from the seed:

- ``central``: Adam on :math:`\nabla_\theta L_X` with the pooled reference X.
- ``fedsgd``: every step each client i computes the gradient of its own loss on the
  one shared generated batch, :math:`\partial \mathrm{KD}(X_i, Y) / \partial Y` at
  :math:`Y = \phi(G_\theta(z_t, c_t))`, from its own data only; the server averages
  them with :math:`\lambda_i = n_i/n`, backpropagates the average through
  :math:`\phi` and G (the chain rule is linear, so this is
  :math:`\sum_i \lambda_i \nabla_\theta L_{X_i}`) and takes its Adam step. Because
  :math:`\sum_i \lambda_i \mathrm{KD}(X_i, Y) - \mathrm{KD}(X, Y)` does not depend on
  Y (Theorem 1 of Wang et al., arXiv 2310.11714), the averaged gradient *is* the
  central one, so FedSGD is central training step for step (to float64 rounding of
  the average, before the float32 backward pass that both share).
- ``fedavg``: rounds of ``local_steps`` steps; each client starts from the global
  weights, takes them with its own Adam (kept across rounds) on its own loss, and the
  server averages the weights with :math:`\lambda_i`. Not the central gradient.
- ``none``: no step (the starting generator).

The generator runs in eval mode: BatchNorm uses the zoo's running statistics, frozen,
so a sample depends on its own latent only and the trained function is the one that
sampling evaluates (BatchNorm's affine weights are trained).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from distrank._checks import positive_int
from distrank._io import array_digest
from distrank._progress import progress
from distrank.clients import client_weights
from distrank.metrics._kernels import Kernel
from distrank.metrics.kd._sums import KDObjective
from distrank.training.federated import (
    average_states,
    training_device,
    training_session,
)
from distrank.training.resume import Checkpoints
from distrank.zoo.cgan import Generator
from distrank.zoo.families import load_network, to_float

__all__ = [
    "METHODS",
    "Lite0Embedding",
    "embed_reference",
    "feature_gradient",
    "finetune_mmd",
    "latent_batches",
]

log = logging.getLogger(__name__)

METHODS = ("fedsgd", "fedavg", "central", "none")


class Lite0Embedding(nn.Module):
    """EfficientNet-Lite0 (ImageNet weights, frozen) on generator outputs, differentiable.

    (N, 1, H, W) images in [-1, 1] -> (N, 1280) pooled features, through the feature
    step's own preprocessing (:func:`distrank.features.efficientnet.lite0_preprocessing`:
    grey to RGB, bilinear resize to ``resolution`` px, ``(x - 127) / 128`` on [0, 255])
    applied to float images, i.e. without the rounding to uint8 that saved samples get.
    The network is built for ``resolution`` (its "same" padding depends on it; None: the
    feature step's, ``DEFAULT_RESOLUTION``).

    Parameters
    ----------
    resolution : int, optional
        Input size in px, at least 8.

    Attributes
    ----------
    resolution
        int: the input size in px.
    net
        torch.nn.Module: the pooled Lite0, frozen, in eval mode.
    """

    def __init__(self, resolution: int | None = None):
        super().__init__()
        from distrank.features.efficientnet import (
            DEFAULT_RESOLUTION,
            PooledLite0,
            lite0_preprocessing,
            load_lite0,
        )

        resolution = DEFAULT_RESOLUTION if resolution is None else resolution

        self.resolution = positive_int(resolution, "resolution", minimum=8)
        self.preprocessing = lite0_preprocessing(self.resolution)
        self.net = PooledLite0(load_lite0(self.resolution)).eval().requires_grad_(False)

    def train(self, mode: bool = True):  # fixed: always in eval mode (BatchNorm statistics)
        return super().train(False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        grey = images.add(1.0).mul(127.5).permute(0, 2, 3, 1)  # NHWC on [0, 255]
        return self.net(self.preprocessing.torch(grey, images.device))


@torch.no_grad()
def embed_reference(
    embedding: nn.Module,
    images,
    *,
    batch_size: int = 256,
    device=None,
    desc: str = "embed reference",
) -> torch.Tensor:
    """phi of uint8 reference images (N, H, W) as a float32 (N, d) tensor on ``device``."""
    dev = training_device(device)
    x, embedding = to_float(images), embedding.to(dev)
    out = [
        embedding(x[i : i + batch_size].to(dev))
        for i in progress(range(0, len(x), batch_size), desc=desc, unit="batch")
    ]
    return torch.cat(out)


def latent_batches(
    *, seed: int, steps: int, batch_size: int, z_dim: int, n_classes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(z (steps, batch, z_dim) standard normal, c (steps, batch) uniform classes), seeded."""
    rng = torch.Generator().manual_seed(seed)
    z = torch.randn(steps, batch_size, z_dim, generator=rng)
    c = torch.randint(n_classes, (steps, batch_size), generator=rng)
    return z, c


def feature_gradient(y: torch.Tensor, objectives: Sequence[KDObjective], weights) -> torch.Tensor:
    r"""sum_i weights[i] * dKD(X_i, Y)/dY at Y = ``y``, in float64 (clients in order).

    Client i computes its term from its own data (``objectives[i]``) and the shared
    batch's features alone; the server sums them. With one objective on the pooled
    reference and weight 1 it is the central gradient; with the clients' objectives and
    :math:`\lambda_i = n_i/n` it equals that (Theorem 1), to float64 rounding.

    Parameters
    ----------
    y : torch.Tensor, shape (m, d)
        The shared batch's features.
    objectives : sequence of KDObjective
        One per client (or one on the pool); each one's pooled KD, ``objective(y)[1]``,
        is differentiated.
    weights : array_like, shape (k,)
        One weight per objective.

    Returns
    -------
    torch.Tensor of float64, shape (m, d)
        The weighted sum of the gradients, on ``y``'s device.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if len(weights) != len(objectives):
        raise ValueError(f"weights: expected {len(objectives)}, got {len(weights)}")
    leaf = y.detach().to(torch.float64).requires_grad_(True)
    total = torch.zeros_like(leaf)
    for w, objective in zip(weights, objectives):
        total += float(w) * torch.autograd.grad(objective(leaf)[1], leaf)[0]
    return total


def _generator(state: dict, device) -> nn.Module:
    gen = load_network(Generator, state).to(device)
    gen.eval()  # frozen BatchNorm statistics (module docstring)
    return gen


def _weights(gen: nn.Module) -> dict:
    return {k: v.detach().to("cpu", copy=True) for k, v in gen.state_dict().items()}


def finetune_mmd(
    state: dict,
    reference: torch.Tensor,
    clients,
    *,
    method: str,
    kernel: Kernel,
    embedding: nn.Module,
    seed: int,
    steps: int,
    batch_size: int,
    lr: float,
    eval_every: int,
    checkpoint_dir,
    local_steps: int = 1,
    threads: int = 2,
    device=None,
) -> list[tuple[int, dict]]:
    """Fine-tune the cGAN ``state`` by ``method`` (module docstring); checkpoints every
    ``eval_every`` steps.

    Parameters
    ----------
    state : dict
        A trained zoo cGAN state (:func:`distrank.zoo.cgan.train_cgan`).
    reference : torch.Tensor, shape (n, d)
        The embedded reference (:func:`embed_reference`).
    clients : array_like of int, shape (n,)
        Each row's client ``0..k-1``; a client's loss sees its own rows only.
    method : str
        One of ``METHODS``.
    kernel : Kernel
        The fixed kernel of the loss (bandwidth chosen once, before training).
    embedding : torch.nn.Module
        The fixed differentiable embedding phi (e.g. :class:`Lite0Embedding`).
    seed : int
        Seeds the latent batches (:func:`latent_batches`); the same for every method.
    steps, batch_size : int
        Generator steps T (a multiple of ``eval_every``); batch size.
    lr : float
        Adam's learning rate (betas 0, 0.9, as the zoo's generator).
    eval_every : int
        Steps between checkpoints (a multiple of ``local_steps`` for fedavg).
    checkpoint_dir : str or os.PathLike
        The job's :class:`~distrank.training.resume.Checkpoints` folder
        (outside its Snakemake outputs); a rerun resumes after the last checkpoint.
    local_steps : int
        fedavg's steps per client per round.
    threads : int
        Intra-op CPU threads.
    device : str or torch.device, optional
        Torch device (None: CUDA when available).

    Returns
    -------
    list of (step, state)
        The zoo state at steps 0, ``eval_every``, ..., ``steps`` (``none``: step 0 only).
    """
    steps, batch_size, eval_every, local_steps = _check_schedule(
        method, steps, batch_size, eval_every, local_steps
    )
    ref = torch.as_tensor(reference)
    clients, ids = _check_clients(ref, clients)
    dev = training_device(device)
    run = {"method": method, "seed": seed, "steps": steps, "batch_size": batch_size, "lr": lr}
    run |= {"eval_every": eval_every, "local_steps": local_steps}
    store = _checkpoints(checkpoint_dir, state, ref, clients, kernel, threads, dev, **run)
    save = _saver(store, state, method)
    with training_session(seed, threads, dev):
        gen = _generator(state, dev)
        resumed = store.resume()
        if resumed is None:
            save(gen, 0)
            resumed = {"point": 0}
        else:
            gen.load_state_dict(resumed["generator"])
        if method != "none":
            data = (ref.to(dev), clients, ids)
            _train(gen, embedding.to(dev), data, kernel, resumed, save, dev, **run)
    points = [0] if method == "none" else range(0, steps + 1, eval_every)
    return [(p, store.load(p)) for p in points]


def _checkpoints(checkpoint_dir, state, ref, clients, kernel, threads, dev, **run) -> Checkpoints:
    """The job's checkpoint store, keyed by everything that determines the run."""
    local_steps = run["local_steps"] if run["method"] == "fedavg" else None
    return Checkpoints(
        checkpoint_dir,
        {
            "trainer": "finetune_mmd",
            "method": run["method"],
            "kernel": kernel.name,
            "kernel_params": dict(kernel.params),
            "seed": run["seed"],
            "steps": run["steps"],
            "batch_size": run["batch_size"],
            "lr": run["lr"],
            "eval_every": run["eval_every"],
            "local_steps": local_steps,
            "threads": threads,
            "device": dev.type,
            "start": array_digest(*(v.numpy() for v in state["generator"].values())),
            "reference": array_digest(ref.cpu().numpy(), clients),
        },
    )


def _train(gen, embedding, data, kernel, resumed, save, dev, *, method, seed, steps, **run):
    """Fine-tune ``gen`` by ``method`` from the resumed point on the shared latent
    batches; ``data`` is (reference on ``dev``, client of each row, client ids)."""
    x, clients, ids = data
    z, c = latent_batches(
        seed=seed,
        steps=steps,
        batch_size=run["batch_size"],
        z_dim=gen.z_dim,
        n_classes=gen.embed.num_embeddings,
    )
    batches = [(z[t].to(dev), c[t].to(dev)) for t in range(steps)]
    objectives, lam = _objectives(method, x, clients, ids, kernel, dev)
    loop = _fedavg if method == "fedavg" else _server
    with progress(total=steps, desc=f"mmd {method}", unit="step") as bar:
        bar.update(int(resumed["point"]))
        loop(
            gen,
            embedding,
            batches,
            objectives=objectives,
            lam=lam,
            lr=run["lr"],
            eval_every=run["eval_every"],
            local_steps=run["local_steps"],
            resumed=resumed,
            save=save,
            bar=bar,
        )


def _check_schedule(method, steps, batch_size, eval_every, local_steps) -> tuple[int, ...]:
    """``steps, batch_size, eval_every, local_steps`` checked as :func:`finetune_mmd`
    documents them."""
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    steps, batch_size = positive_int(steps, "steps"), positive_int(batch_size, "batch_size")
    eval_every = positive_int(eval_every, "eval_every")
    local_steps = positive_int(local_steps, "local_steps")
    if steps % eval_every:
        raise ValueError(f"steps ({steps}) must be a multiple of eval_every ({eval_every})")
    if method == "fedavg" and eval_every % local_steps:
        raise ValueError(
            f"eval_every ({eval_every}) must be a multiple of local_steps "
            f"({local_steps}) for fedavg"
        )
    return steps, batch_size, eval_every, local_steps


def _check_clients(ref: torch.Tensor, clients) -> tuple[np.ndarray, np.ndarray]:
    """The client id of every reference row, ``0..k-1``, and the ids."""
    clients = np.asarray(clients)
    ids = np.unique(clients)
    if clients.shape != (len(ref),) or not np.array_equal(ids, np.arange(len(ids))):
        raise ValueError(
            f"clients: expected {len(ref)} client ids 0..k-1, got "
            f"{clients.shape} with ids {ids.tolist()}"
        )
    return clients, ids


def _saver(store: Checkpoints, state: dict, method: str):
    """``save(gen, step, **resume)``: a checkpoint of the zoo state at ``step``."""

    def save(gen, step, **resume):
        weights = _weights(gen)
        store.save(
            step,
            {
                "family": "cgan",
                "config": state["config"],
                "generator": weights,
                "history": {"method": method, "step": step},
            },
            {"generator": weights, **resume},
        )

    return save


def _objectives(method, x, clients, ids, kernel, dev) -> tuple[list, np.ndarray]:
    """The KD objectives (the pool for central, else one per client's own rows) and
    their weights."""
    if method == "central":  # one objective on the pool
        parts, lam = [x], np.ones(1)
    else:  # each client's own rows only
        parts = [x[torch.from_numpy(clients == i).to(dev)] for i in ids]
        lam = client_weights(np.bincount(clients), "size")
    objectives = [
        KDObjective(part, np.zeros(len(part), np.int64), kernel, dtype="float64", device=dev)
        for part in parts
    ]
    return objectives, lam


def _server(gen, embedding, batches, *, objectives, lam, lr, eval_every, resumed, save, bar, **_):
    """central and fedsgd: one generator; every step the server backpropagates the
    gradient with respect to the shared batch's features (pooled, or the clients'
    average) through the embedding and the generator, and takes an Adam step."""
    opt = torch.optim.Adam(gen.parameters(), lr=lr, betas=(0.0, 0.9))
    if "optimizer" in resumed:
        opt.load_state_dict(resumed["optimizer"])
    for t in range(int(resumed["point"]) + 1, len(batches) + 1):
        y = embedding(gen(*batches[t - 1]))
        opt.zero_grad(set_to_none=True)
        y.backward(feature_gradient(y, objectives, lam).to(y.dtype))
        opt.step()
        bar.update()
        if t % eval_every == 0:
            save(gen, t, optimizer=opt.state_dict())


def _fedavg(
    gen,
    embedding,
    batches,
    *,
    objectives,
    lam,
    lr,
    eval_every,
    local_steps,
    resumed,
    save,
    bar,
    **_,
):
    """fedavg: each client's generator and Adam (kept across rounds), weights averaged."""
    local = [copy.deepcopy(gen) for _ in objectives]
    opts = [torch.optim.Adam(g.parameters(), lr=lr, betas=(0.0, 0.9)) for g in local]
    for opt, s in zip(opts, resumed.get("optimizers", ())):
        opt.load_state_dict(s)
    for start in range(int(resumed["point"]), len(batches), local_steps):
        for g_i, opt, objective in zip(local, opts, objectives):
            g_i.load_state_dict(gen.state_dict())
            for t in range(start + 1, start + local_steps + 1):
                loss = objective(embedding(g_i(*batches[t - 1])))[1]
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        gen.load_state_dict(average_states([g.state_dict() for g in local], lam))
        bar.update(local_steps)
        if (start + local_steps) % eval_every == 0:
            save(gen, start + local_steps, optimizers=[o.state_dict() for o in opts])
