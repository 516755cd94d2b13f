"""What a family of metrics implements, and what its paths are given.

A :class:`Family` computes one or more metrics (PRDC's four come from one pass). Its
``plain`` path is required; ``partitions`` and ``resample`` are optional, and where a
family returns None from them the scorer takes the path by scoring afresh. Values
flow as ``{model: {key: (pooled value, per-client values)}}`` (:data:`Values`).
Torch-free: a family imports what it computes with inside its methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: model -> output key (a metric, or a spread such as ``kd_std``) -> (pooled, (k,) per client)
Values = dict[str, dict[str, tuple[float, Any]]]


@dataclass(frozen=True)
class Inputs:
    """The checked inputs of one scoring call (``metrics.scoring.prepare``): the
    reference rows (a torch tensor), its client groups, the models' rows, the options
    (with an rbf/laplace bandwidth resolved), the kernel of KD (None without KD), the
    torch device and the rows of one product block."""

    reference: Any
    groups: Any  # distrank.clients.ClientGroups
    models: dict[str, Any]
    options: Any  # ScoreOptions
    kernel: Any
    device: Any
    block_size: int

    def client_rows(self, c: int):
        import torch

        return self.reference[torch.from_numpy(self.groups.rows(c))]


@dataclass(frozen=True)
class Partitioned:
    """The inputs of ``metrics.score_partitions``: one reference, many partitions of it
    (name -> ClientGroups), as :class:`Inputs` has them otherwise."""

    reference: Any
    partitions: Mapping[str, Any]
    models: dict[str, Any]
    options: Any
    kernel: Any
    device: Any
    block_size: int


@dataclass
class Run:
    """A prepared computation: ``compute(products=None)`` returns :data:`Values`.

    Two families may share products (KD's sums from PRDC's distance blocks): a run
    with ``feeds_products`` forms every product block a kernel sum needs and hands
    them to a ``kd.SumsBuilder`` passed as ``products``; a run with ``kernel`` and
    ``from_sums`` can take its values from such a builder's ``KernelSums`` instead
    of its own pass (``metrics.scoring`` wires them)."""

    compute: Callable[..., Values]
    feeds_products: bool = False
    kernel: Any = None
    from_sums: Callable[[Any], Values] | None = None


class Family:
    """How a group of metrics is computed (module doc)."""

    #: whether its metrics need KD's kernel (``Inputs.kernel``)
    uses_kernel = False

    def plain(self, inputs: Inputs, keys: Sequence[str]) -> Run:
        """The values of ``keys`` for every model, pooled and per client."""
        raise NotImplementedError

    def partitions(self, inputs: Partitioned, keys: Sequence[str]) -> dict[str, Values] | None:
        """Partition name -> values, sharing the work no partition changes; None:
        score each partition afresh."""
        return None

    def resample(self, resampler, keys: Sequence[str], client_draws, model_draws):
        """(batch, len(keys), M, 2 + k) values of a batch of bootstrap resamples
        (``metrics.bootstrap``); None: score each resample afresh."""
        return None


class SecureSum:
    """How a metric enters Flower's secure mode (``distrank.flower.secure``): what a
    site adds to the sum and what the server makes of the sum.

    ``blocks(ctx)`` lists (name, length, bound on |entry|) of the site's entries, the
    bound from public settings only (``ctx``: feature bound F, max rows N, models,
    weights, kernel bound, dim); ``site(ctx, x, scores, centre)`` gives those entries
    from the site's rows and its client scores; ``finish(ctx, sums, n, k, centre)`` gives
    (aggregation, values per model, bound per model) from the summed blocks.
    """

    aggregation = "avg"

    def blocks(self, ctx) -> list[tuple[str, int, float]]:
        raise NotImplementedError

    def site(self, ctx, x, scores, centre) -> dict:
        raise NotImplementedError

    def finish(self, ctx, sums: Mapping, n: int, k: int, centre):
        raise NotImplementedError
