r"""What federated training needs beside the model: shards, weights, seeds, averaging, device.

The server step of FedAvg (McMahan et al., "Communication-Efficient Learning of Deep
Networks from Decentralized Data", AISTATS 2017) replaces the global weights by the
clients' weighted average

.. math::
    w \leftarrow \sum_i \lambda_i w_i, \qquad \lambda_i = n_i / n,

the weights under which the averaged KD objectives differ from the pooled one by a
constant (Theorem 1 of Wang et al., arXiv 2310.11714).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from distrank._arrays import resolve_device
from distrank.clients import UNASSIGNED, client_weights

__all__ = [
    "Shard",
    "average_states",
    "client_seed",
    "client_shards",
    "momentum_step",
    "training_device",
    "training_session",
]


@dataclass(frozen=True)
class Shard:
    """One client's training images (uint8 (n, H, W)) and labels (int64 (n,))."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)


def client_shards(images, labels, clients) -> list[Shard]:
    """The rows of each client ``0..k-1`` (``clients`` holds each row's client, as
    :func:`distrank.clients.partition` returns it; ``UNASSIGNED`` rows are left out).

    Parameters
    ----------
    images : array_like, shape (N, H, W)
        The training images (uint8, as a ``Shard`` holds them).
    labels : array_like of int, shape (N,)
        Their class labels.
    clients : array_like of int, shape (N,)
        Each row's client, in 0..k-1 or ``UNASSIGNED``.

    Returns
    -------
    list of Shard, length k
        Client c's images and labels (int64), in their original order.

    Raises
    ------
    ValueError
        Lengths that differ, or client ids that are not 0..k-1.
    """
    images, labels, clients = np.asarray(images), np.asarray(labels), np.asarray(clients)
    if not (len(images) == len(labels) == len(clients)):
        raise ValueError(
            f"images, labels and clients must have the same length, got "
            f"{len(images)}, {len(labels)}, {len(clients)}"
        )
    ids = np.unique(clients[clients != UNASSIGNED])
    if not len(ids) or not np.array_equal(ids, np.arange(len(ids))):
        raise ValueError(
            f"clients: expected ids 0..k-1 (and {UNASSIGNED} for unassigned), got {ids.tolist()}"
        )
    return [Shard(images[clients == c], labels[clients == c].astype(np.int64)) for c in ids]


def shard_weights(shards: Sequence[Shard]) -> np.ndarray:
    """lambda_i = n_i / n of the shards."""
    return client_weights([len(s) for s in shards], "size")


def average_states(states: Sequence[Mapping[str, torch.Tensor]], weights) -> dict:
    """The weighted average ``sum_i weights[i] * states[i][key]`` of every floating tensor.

    Sums are formed in float64 in client order and cast back, so the result does not
    depend on the device's reduction order. Integer tensors (BatchNorm's
    ``num_batches_tracked``) must be equal in every state and are kept.

    Parameters
    ----------
    states : sequence of mapping of str to torch.Tensor
        The clients' ``state_dict()``, at least one, with the same keys in the same order.
    weights : array_like, shape (k,)
        One weight per state (FedAvg: lambda_i = n_i / n), used as given.

    Returns
    -------
    dict of str to torch.Tensor
        Each key's average in its dtype (an integer tensor: a copy of the first's).

    Raises
    ------
    ValueError
        Weights that do not match the states, keys that differ, or integer tensors that
        disagree.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if len(states) != len(weights) or not len(states):
        raise ValueError(
            f"weights: expected one weight per state ({len(states)}), got {len(weights)}"
        )
    keys = list(states[0])
    for i, state in enumerate(states[1:], 1):
        if list(state) != keys:
            raise ValueError(f"states[{i}] has other keys than states[0]")
    out = {}
    for key in keys:
        first = states[0][key]
        if first.is_floating_point():
            total = sum(float(w) * s[key].to(torch.float64) for w, s in zip(weights, states))
            out[key] = total.to(first.dtype)
        else:
            if any(not torch.equal(s[key], first) for s in states[1:]):
                raise ValueError(f"states disagree on the integer tensor {key!r}")
            out[key] = first.clone()
    return out


def momentum_step(
    previous: Mapping[str, torch.Tensor],
    averaged: Mapping[str, torch.Tensor],
    velocity: Mapping[str, torch.Tensor] | None,
    beta: float,
    names,
) -> tuple[dict, dict]:
    """FedAvgM's server step (Hsu, Qi and Brown, arXiv 1909.06335): on the tensors
    ``names`` (the networks' parameters), ``v <- beta v + (avg - w)`` and ``w <- w + v``,
    from the previous global ``w`` and the clients' average ``avg``; every other tensor
    (running statistics) takes the average. ``velocity`` None starts from zero: the
    first step keeps the average exactly. Returns (new global state, new velocity)."""
    out, new_velocity = dict(averaged), {}
    for key in names:
        step = averaged[key] - previous[key]
        if velocity is not None:
            step = step + beta * velocity[key]
            out[key] = previous[key] + step
        new_velocity[key] = step
    return out, new_velocity


def client_seed(seed: int, client: int) -> int:
    """A 63-bit seed for client ``client``'s random stream, from ``(seed, client)``."""
    return int(np.random.SeedSequence([seed, client]).generate_state(2, np.uint64)[0] >> 1)


@contextlib.contextmanager
def training_session(seed: int, threads: int, device: torch.device):
    """:func:`distrank.zoo.torch_session` (seeded global RNG, ``threads`` CPU threads,
    deterministic kernels), relaxed to warnings on CUDA, where some backward kernels
    (e.g. adaptive average pooling's) have no deterministic version; the bitwise
    guarantees of this package are the CPU's."""
    from distrank.zoo import deterministic_algorithms, torch_session

    with torch_session(seed, threads):
        if device.type == "cuda":
            deterministic_algorithms(True, warn_only=True)
        yield


def training_device(device=None) -> torch.device:
    """``device`` (None: CUDA when available, else the CPU), ready for deterministic runs.

    On CUDA, cuBLAS is deterministic only with a fixed workspace
    (``CUBLAS_WORKSPACE_CONFIG``, set here unless the environment sets it; it must be
    set before the process first uses cuBLAS).
    """
    dev = resolve_device(device)
    if dev.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return dev
